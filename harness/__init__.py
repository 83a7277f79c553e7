"""What drives real processes for the demo, the benchmarks and the end-to-end tests.

- :mod:`harness.processes`: a free port, start a process with a log, wait until it answers, stop it;
- :mod:`harness.loadgen`: the open-loop load generator (a trace against an OpenAI-compatible server);
- :mod:`harness.traces`: where the Azure 2023 conversation trace is (shared data, else the bundled slice);
- :mod:`harness.monitoring`: Prometheus and Alertmanager command lines;
- :mod:`harness.webhook`: a receiver for Alertmanager's notifications;
- :mod:`harness.vllm_server`: a vLLM server as a child process.
"""
