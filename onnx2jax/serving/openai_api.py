"""OpenAI's request and response bodies: what the server accepts, refuses, and answers.

Implemented: ``model``, ``prompt`` (a string or token ids; one of them) / ``messages``, ``max_tokens`` (chat:
also ``max_completion_tokens``), ``temperature`` (0 greedy), ``top_p``, ``top_k`` and ``repetition_penalty``
(extensions vLLM also takes), ``seed``; where a field is absent, the model folder's genai_config.json search
options give its default (:mod:`onnx2jax.runtime.search_options`: ``do_sample`` false is temperature 0), else
OpenAI's (temperature 1); ``stop`` (a string or up to 4), ``n`` (1 only),
``stream``, ``stream_options.include_usage``, ``user`` (kept for nobody: it only names the caller). Fields that
change nothing at their default (``presence_penalty`` 0, ``echo`` false, ``best_of`` 1, ``logprobs`` null, ...)
are accepted at that default and refused by name otherwise; any other field is refused by name: nothing is
silently ignored. Every choice also carries ``token_ids``, the generated tokens (an extension).
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from typing import Any

from onnx2jax.errors import RequestError
from onnx2jax.runtime.search_options import SearchDefaults
from onnx2jax.serving.params import SamplingParams

_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "repetition_penalty", "seed", "stop", "n",
           "stream", "stream_options", "user"}
COMPLETION_FIELDS = _COMMON | {"prompt"}
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens"}
# accepted only at the value that changes nothing
_NO_OP = {"presence_penalty": (0, 0.0, None), "frequency_penalty": (0, 0.0, None), "echo": (False, None),
          "best_of": (1, None), "logprobs": (None, False), "top_logprobs": (None, 0), "logit_bias": (None,),
          "suffix": (None, ""), "parallel_tool_calls": (None,), "tools": (None, []), "tool_choice": (None, "none"),
          "response_format": (None,), "service_tier": (None, "auto"), "store": (None, False)}


@dataclasses.dataclass
class Parsed:
    """A request body checked: the prompt's ids, the sampling parameters, the stop strings and the options."""

    prompt: list[int]
    params: SamplingParams
    stop: list[str]
    stream: bool
    include_usage: bool
    model: str


def check_fields(body: Any, allowed: set[str]) -> None:
    """Refuses a body that is not an object, and every field not implemented (named)."""
    if not isinstance(body, dict):
        raise RequestError("body", "must be a JSON object")
    for name, value in body.items():
        if name in allowed:
            continue
        if name in _NO_OP:
            if any(_same(value, default) for default in _NO_OP[name]):
                continue
            raise RequestError(name, f"is not implemented by this server (only {_NO_OP[name][0]!r} is accepted)")
        raise RequestError(name, "is not a parameter this server implements")


def _same(a: Any, b: Any) -> bool:
    """Equal, with a bool equal only to itself (False is not 0 here)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return a == b


def _number(body: dict, name: str, default: float, kind: type = float) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise RequestError(name, f"must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    return kind(value)


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
        raise RequestError("stop", "must be a non-empty string or a list of up to 4 of them")
    return stop


OPENAI = SearchDefaults(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0, seed=None)
"""OpenAI's defaults: those of a model without genai_config.json."""


def parse(body: dict, prompt: list[int], *, context: int, default_max_tokens: int | None, model: str,
          defaults: SearchDefaults | None = None) -> Parsed:
    """The sampling parameters and options of a checked body whose prompt is ``prompt``; an absent field takes
    ``defaults`` (the folder's search options; None: OpenAI's).

    Raises:
      RequestError: a value of the wrong type or out of range, n != 1, or a prompt and max_tokens past the context.
    """
    if _number(body, "n", 1, int) != 1:
        raise RequestError("n", "only n=1 is implemented")
    if len(prompt) >= context:
        raise RequestError("prompt", f"has {len(prompt)} tokens; the model's context is {context}, which leaves no "
                           "room for a new token")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is None:
        max_tokens = default_max_tokens if default_max_tokens is not None else context - len(prompt)
    elif isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise RequestError("max_tokens", f"must be an integer, got {max_tokens!r}")
    if max_tokens > 0 and len(prompt) + max_tokens > context:
        raise RequestError("max_tokens", f"prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) is past the "
                           f"model's context of {context}")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise RequestError("stream", f"must be true or false, got {stream!r}")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise RequestError("stream_options", "only include_usage is implemented")
    folder = defaults or OPENAI
    top_k = _number(body, "top_k", folder.top_k, int)
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", folder.temperature if folder.do_sample else 0.0),
        top_p=_number(body, "top_p", folder.top_p),
        top_k=0 if top_k == -1 else top_k,  # vLLM's -1: no limit, as 0
        repetition_penalty=_number(body, "repetition_penalty", folder.repetition_penalty),
        seed=_number(body, "seed", folder.seed or 0, int),
    )
    return Parsed(prompt, params, _stop(body), stream, bool(options.get("include_usage")), model)


def completion_prompt(body: dict) -> str | list[int]:
    """The prompt of /v1/completions: a string or a list of token ids (one prompt)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    raise RequestError("prompt", "must be a string or a list of token ids (one prompt: n and batches of prompts "
                       "are not implemented)")


def chat_messages(body: dict) -> list[dict]:
    """The messages of /v1/chat/completions, each with a role and string content (a list of text parts is
    joined)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages", "must be a non-empty list")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError("messages", f"message {i} needs a role")
        content = message.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise RequestError("messages", f"message {i}: only text content is implemented")
            content = "".join(p.get("text", "") for p in content)
        if not isinstance(content, str):
            raise RequestError("messages", f"message {i}: content must be a string")
        out.append({"role": message["role"], "content": content})
    return out


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def chunk(kind: str, rid: str, model: str, piece: str, tokens: list[int], finish: str | None,
          first: bool = False, created: int | None = None) -> dict:
    """One streamed event of ``kind`` ``"completion"`` or ``"chat"`` (``created``: the reply's start, in Unix
    seconds; default now)."""
    created = int(time.time()) if created is None else created
    if kind == "completion":
        choice = {"index": 0, "text": piece, "logprobs": None, "finish_reason": finish, "token_ids": tokens}
        return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [choice]}
    delta: dict[str, Any] = {"content": piece}
    if first:
        delta["role"] = "assistant"
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, "token_ids": tokens}
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [choice]}


def sse(data: dict[str, Any]) -> bytes:
    """One server-sent event carrying ``data`` as JSON."""
    return f"data: {json.dumps(data)}\n\n".encode()


class StreamEvents:
    """The server-sent events of one streamed reply, encoded from a template: a token's event is the bytes
    :func:`chunk` and :func:`sse` would give, built without a dict or a JSON encoding of the whole per token (the
    template is :func:`chunk`'s own output with placeholders, cut where the text and the token go). The first
    event of a chat reply and the last of any reply carry more and are built in full."""

    _PIECE, _TOKEN = "\x00piece\x00", -12345

    def __init__(self, kind: str, rid: str, model: str):
        self.kind, self.rid, self.model, self.created = kind, rid, model, int(time.time())
        # The text and the tokens come after the id and the model in the event, so the last occurrences of the
        # placeholders are theirs whatever the model's name holds.
        text = sse(chunk(kind, rid, model, self._PIECE, [self._TOKEN], None, created=self.created)).decode()
        head, _, tail = text.rpartition(json.dumps(self._PIECE))
        middle, _, end = tail.rpartition(f"[{self._TOKEN}]")
        self._head, self._middle, self._end = head.encode(), (middle + "[").encode(), ("]" + end).encode()

    def event(self, piece: str, token: int | None, finish: str | None = None, first: bool = False) -> bytes:
        """The event of one token (None: none) and its text ``piece``; ``finish``: the reply's finish reason."""
        if finish is not None or (first and self.kind == "chat"):
            return sse(chunk(self.kind, self.rid, self.model, piece, [] if token is None else [token], finish,
                             first, self.created))
        return b"".join((self._head, json.dumps(piece).encode(), self._middle,
                         b"" if token is None else str(token).encode(), self._end))


def whole(kind: str, rid: str, model: str, text: str, tokens: list[int], finish: str, usage: dict) -> dict:
    """The answer of a request that does not stream."""
    if kind == "completion":
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "token_ids": tokens}
        return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
                "choices": [choice], "usage": usage}
    choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
              "finish_reason": finish, "token_ids": tokens}
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [choice], "usage": usage}


def usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def error(message: str, *, param: str | None = None, kind: str = "invalid_request_error",
          code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
