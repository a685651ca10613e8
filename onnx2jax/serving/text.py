"""Text in and out of the server: the folder's tokenizer, its chat template, and detokenizing a stream of
tokens with stop strings.

The tokenizer is the folder's ``tokenizer.json`` (the ``tokenizers`` library); the chat template is
``chat_template.jinja`` or ``tokenizer_config.json``'s ``chat_template``, rendered as transformers renders it
(a sandboxed jinja2 environment with ``messages``, ``add_generation_prompt``, ``bos_token``, ``eos_token``).
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

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


class IncrementalText:
    """The text of a stream of tokens, a piece per token as it comes, in constant time per token: the pieces
    joined (and :meth:`flush` at the end) equal ``decode(prompt + tokens)`` past ``decode(prompt)``.

    Each piece is the text a short window of tokens adds to the window before it (vLLM's prefix / read
    offsets): the window starts a few tokens back, inside the prompt at first, so a token keeps its leading
    space as it has in context (sentencepiece's "▁" and the decoders' strip of the text's first space apply to
    the window's start, which is already given out), and a UTF-8 character whose bytes span several tokens
    (byte-level BPE, byte fallback) is held back until its last byte comes, never given half. The tokenizers
    library's own ``DecodeStream`` (0.23) gives the prompt's text again when seeded with the prompt's ids, so
    it is not used.

    Args:
      tokenizer: a ``tokenizers.Tokenizer``; special tokens are skipped, as :meth:`Text.decode` does.
      prompt: the ids before the stream (their text is not given out; their last few are context).
    """

    CONTEXT = 6
    """Prompt tokens the first window starts with."""

    def __init__(self, tokenizer: Any, prompt: Sequence[int] = ()):
        self.tokenizer = tokenizer
        self._ids = [int(t) for t in prompt[-self.CONTEXT:]]
        self._prefix = 0  # the window's start: text before it was given out
        self._read = len(self._ids)  # tokens before it are given out, those after not yet

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def add(self, token: int) -> str:
        """The text ``token`` completes (empty while it ends in an unfinished character)."""
        self._ids.append(int(token))
        before = self._decode(self._ids[self._prefix:self._read])
        after = self._decode(self._ids[self._prefix:])
        if len(after) <= len(before) or after.endswith("\ufffd") or not after.startswith(before):
            return ""
        self._ids = self._ids[self._read:]  # the next window starts where this one's new text began
        self._prefix, self._read = 0, len(self._ids)
        return after[len(before):]

    def flush(self) -> str:
        """The text held back at the end of the stream (an unfinished character comes as U+FFFD, as in the
        full decode)."""
        before = self._decode(self._ids[self._prefix:self._read])
        after = self._decode(self._ids[self._prefix:])
        self._ids, self._prefix, self._read = self._ids[self._read:], 0, 0
        return after[len(before):] if after.startswith(before) else after


class Detokenizer:
    """Turns one request's tokens into text pieces as they come (:class:`IncrementalText`: constant work per
    token), holding back what may still become a stop string, and finding the first stop string.

    Attributes:
      stopped: a stop string was reached; the text ends before it.
    """

    def __init__(self, text: Text, stop: list[str], prompt: Sequence[int] = ()):
        self.stop = stop
        self.stream = IncrementalText(text.tokenizer, prompt)
        self.stopped = False
        self._held = ""  # text made but not given out: it may still begin a stop string
        self._hold = max((len(s) for s in stop), default=1) - 1

    def add(self, tokens: list[int]) -> str:
        """The new text the tokens make available (possibly empty)."""
        if self.stopped:
            return ""
        for token in tokens:
            self._held += self.stream.add(token)
        return self._give(final=False)

    def flush(self) -> str:
        """The text held back, at the end of generation."""
        if self.stopped:
            return ""
        self._held += self.stream.flush()
        return self._give(final=True)

    def _give(self, final: bool) -> str:
        """The held text that can no longer be part of a stop string; all of it up to a stop string found."""
        hits = [i for i in (self._held.find(s) for s in self.stop) if i >= 0]
        if hits:
            self.stopped = True
            piece, self._held = self._held[:min(hits)], ""
            return piece
        end = len(self._held) if final else max(len(self._held) - self._hold, 0)
        piece, self._held = self._held[:end], self._held[end:]
        return piece
