"""An engine client that records what reaches it and refuses it: for tests of what the API routes send."""

from __future__ import annotations

from contracts.errors import ValidationError
from engine.sampling import SamplingParams


class RecordingEngine:
    """Records each request's prompt ids and parameters, then refuses it with a 400 ("recorded")."""

    max_model_len = 4096
    context_note: str | None = None

    def __init__(self) -> None:
        self.prompts: list[list[int]] = []
        self.params: list[SamplingParams] = []

    def check_prompt_ids(self, ids: object) -> None:
        pass

    def check_prompt(self, prompt: list[int], params: SamplingParams) -> None:
        pass

    def add_request(self, prompt: list[int], params: SamplingParams, **_: object) -> None:
        self.prompts.append(list(prompt))
        self.params.append(params)
        raise ValidationError("recorded")

    def abort(self, request_id: str, reason: str = "abort") -> None:
        pass
