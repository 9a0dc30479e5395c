"""What notebooks 10 and 13 show once, beside the course's server (the demo page notebook 10
writes in a cell of its own).

- ``openai_api``: the OpenAI-compatible routes (``/v1/...``) on the same engine.
- ``engine_process``: the engine in a process of its own, over a pipe.
- ``ray_app`` and ``litserve_app``: the same model served by Ray Serve replicas and by LitServe.
- ``breakdown``: where a server's time goes under load. ``bare``: the model's tokens/s with no server.
- ``tokentimes``: when each streamed token arrived (TTFT, inter-token gaps, their percentiles).
"""
