"""Text in and out of the server: the folder's tokenizer, its chat template, and detokenizing a stream of
tokens with stop strings.

The tokenizer is the folder's ``tokenizer.json`` (the ``tokenizers`` library); the chat template is
``chat_template.jinja`` or ``tokenizer_config.json``'s ``chat_template``, rendered as transformers renders it
(a sandboxed jinja2 environment with ``messages``, ``add_generation_prompt``, ``bos_token``, ``eos_token``).
"""

from __future__ import annotations

import json
import os
from typing import Any

from onnx2jax.errors import RequestError


class Text:
    """A model folder's tokenizer and chat template.

    Raises:
      FileNotFoundError: no tokenizer.json in the folder (named).
    """

    def __init__(self, folder: str | os.PathLike):
        from tokenizers import Tokenizer

        folder = os.fspath(folder)
        path = os.path.join(folder, "tokenizer.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{folder}: no tokenizer.json; the server needs the model's tokenizer")
        self.tokenizer = Tokenizer.from_file(path)
        config_path = os.path.join(folder, "tokenizer_config.json")
        self.config: dict[str, Any] = json.loads(open(config_path).read()) if os.path.isfile(config_path) else {}
        self.chat_template = self._template(folder)
        self.folder = folder

    def _template(self, folder: str) -> str | None:
        path = os.path.join(folder, "chat_template.jinja")
        if os.path.isfile(path):
            return open(path).read()
        template = self.config.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        return template

    def _special(self, name: str) -> str:
        value = self.config.get(name)
        return value.get("content", "") if isinstance(value, dict) else (value or "")

    def encode(self, text: str, *, special: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=special).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def chat_prompt(self, messages: list[dict[str, Any]]) -> str:
        """The messages rendered by the chat template, with the generation prompt.

        Raises:
          RequestError: the folder has no chat template (named), or the template refused the messages.
        """
        if self.chat_template is None:
            raise RequestError(
                "messages", f"the model has no chat template (no chat_template.jinja and no chat_template in "
                f"{os.path.join(self.folder, 'tokenizer_config.json')}): use /v1/completions with a prompt"
            )
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise RequestError("messages", f"the chat template refused them: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        try:
            return env.from_string(self.chat_template).render(
                messages=messages, add_generation_prompt=True, bos_token=self._special("bos_token"),
                eos_token=self._special("eos_token"),
            )
        except jinja2.TemplateError as error:
            raise RequestError("messages", f"the chat template failed on them: {error}") from error


class Detokenizer:
    """Turns one request's tokens into text pieces as they come, holding back what may still become a stop
    string (or an incomplete UTF-8 character), and finding the first stop string.

    Attributes:
      stopped: a stop string was reached; the text ends before it.
    """

    def __init__(self, text: Text, stop: list[str]):
        self.text, self.stop = text, stop
        self.ids: list[int] = []
        self.sent = 0  # characters of the text given out
        self.stopped = False
        self._hold = max((len(s) for s in stop), default=1) - 1

    def add(self, tokens: list[int]) -> str:
        """The new text the tokens make available (possibly empty)."""
        if self.stopped:
            return ""
        self.ids.extend(tokens)
        full = self.text.decode(self.ids)
        hits = [i for i in (full.find(s, max(self.sent - len(s) + 1, 0)) for s in self.stop) if i >= 0]
        if hits:
            self.stopped = True
            return self._take(full, min(hits))
        ready = len(full) - self._hold
        if full.endswith("\ufffd"):  # a character whose bytes are not all here yet
            ready = min(ready, len(full) - 1)
        return self._take(full, ready)

    def flush(self) -> str:
        """The text held back, at the end of generation."""
        if self.stopped:
            return ""
        return self._take(self.text.decode(self.ids), None)

    def _take(self, full: str, end: int | None) -> str:
        end = len(full) if end is None else max(end, self.sent)
        piece = full[self.sent:end]
        self.sent = end
        return piece
