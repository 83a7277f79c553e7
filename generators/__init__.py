"""Generators of the committed artifacts: Prometheus rules and Alertmanager routing (``alerts/``),
Grafana dashboards (``dashboards/``) and the generated parts of the Kubernetes manifests (``deploy/``).

They read SLO policies (:mod:`controller.policy_files`) and never run the tick loop; the
runtime controller does not import them.  ``moeslo alerts|dashboards|deploy`` call them,
and tests fail when the committed files drift from what they generate.
"""
