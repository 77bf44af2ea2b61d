"""User-facing errors. Each carries a message that names the offending field or file and the fix;
the CLI prints it without a traceback."""


class SpeccError(Exception):
    """Base of every error that is the user's input, not a bug."""


class PlanError(SpeccError):
    """A plan that cannot be composed, parsed or typed (unknown key, wrong type, bad YAML, missing file)."""


class CheckpointError(SpeccError):
    """A model or drafter checkpoint that is missing, malformed or does not match the plan."""


class ArtifactError(SpeccError):
    """A compiled artifact that is missing, tampered with or truncated."""


class PromptError(SpeccError):
    """Prompts that cannot be read or tokenized, or that do not fit the model."""


class PromptTooLongError(PromptError):
    """A text with more tokens than allowed, refused from its byte length alone
    (:meth:`specc.models.tokenizer.Tokenizer.encode_within`). ``min_tokens``: the fewest tokens it can
    have; ``num_bytes``: its UTF-8 length; ``bytes_per_token``: the tokenizer's bound."""

    def __init__(self, message: str, min_tokens: int, num_bytes: int, bytes_per_token: int) -> None:
        super().__init__(message)
        self.min_tokens, self.num_bytes, self.bytes_per_token = min_tokens, num_bytes, bytes_per_token
