# vLLM with the moeslo plugin: the official vLLM OpenAI server image of the version moeslo
# is tested against (vLLM 0.32.0, as pyproject's `vllm` extra and bench/vllm.py pin it),
# plus this package without its dependencies, so vLLM finds the plugin's entry points
# (`vllm.general_plugins` and `vllm.stat_logger_plugins` in pyproject.toml).  The plugin
# stays idle unless MOESLO_VLLM_PLUGIN=1, which the manifests set.  Our planner as vLLM's EPLB
# policy (controller/rebalance/vllm_policy.py) needs scipy, which vLLM does not bring: it is
# installed at pyproject's pin (as `make vllm-venv` does; pip keeps vLLM's numpy where it fits),
# and the build imports every module an entry point names, so a missing one fails here rather
# than vLLM dropping the plugin at start-up and planning with its default policy.
#
# The image's Python is 3.12 while pyproject says ">=3.11,<3.12" (what the core stack is
# tested on); the plugin's modules use nothing 3.12 removed, hence --ignore-requires-python.
FROM vllm/vllm-openai:v0.32.0

WORKDIR /opt/moeslo/src
COPY . .
RUN python3 -m pip install --no-cache-dir --no-deps --ignore-requires-python . \
    && python3 -m pip install --no-cache-dir 'scipy>=1.13,<2' \
    && python3 -c "import exporters.vllm_metrics, exporters.vllm_otel, exporters.vllm_ttft, exporters.vllm_eplb_http, controller.rebalance.vllm_policy"
WORKDIR /vllm-workspace
ENTRYPOINT ["vllm", "serve"]
