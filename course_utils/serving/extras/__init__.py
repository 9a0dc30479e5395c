"""What notebooks 10 and 13 show once beside the course's server (their Gradio page, LitServe and Ray
Serve apps are programs they write in cells of their own).

- ``openai_api``: the OpenAI-compatible routes (``/v1/...``) on the same engine.
- ``engine_process``: the engine in a process of its own, over a pipe.
- ``breakdown``: where a server's time goes under load. ``bare``: the model's tokens/s with no server.
- ``tokentimes``: when each streamed token arrived (TTFT, inter-token gaps, their percentiles).
"""
