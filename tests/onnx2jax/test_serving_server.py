"""`onnx2jax serve` (issue 29) answers the real `openai` client and httpx on 127.0.0.1: greedy tokens equal
onnxruntime-genai's stored ones (and a plain onnxruntime loop for chat), streams one token per event while the
request still runs, refuses bad input by name, queues then answers 429, frees a disconnected client's slot and
pages, and on SIGTERM finishes the request in flight and exits 0. One server for the module."""

from __future__ import annotations

import concurrent.futures
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import httpx
import jinja2
import numpy as np
import onnxruntime as ort
import openai
import pytest
from tokenizers import Tokenizer

from onnx2jax.errors import RequestError
from onnx2jax.serving.text import Detokenizer, Text

ROOT = pathlib.Path(__file__).parents[2]
GENAI = ROOT / "tests" / "data" / "genai"
EXPECTED = json.loads((GENAI / "llama_gqa" / "expected_tokens.json").read_text())
TEMPLATE = "{% for m in messages %}<s>{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
MODEL = "tiny"


START_S = 600  # the longest a server may take to load, compile and listen: generous, for a machine under load
LISTENING = re.compile(r"onnx2jax serve: \S+ on http://127\.0\.0\.1:(\d+)/v1")


class _Output:
    """A process's output, drained by a thread as it comes (the pipe never fills), its lines kept."""

    def __init__(self, process: subprocess.Popen):
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(process.stdout,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append(line)

    def __str__(self) -> str:
        return "".join(self.lines)


SHORT_CONTEXT = ("--context-length", "64")
"""For a server whose requests need at most 32 positions: the folder's 256 would have its start-up compile
programs for four times the cache width (~10 s of the run). The module's own server runs at 128 (`CONTEXT`)."""

CONTEXT = 128
"""The module server's context: its queue and disconnect tests hold slots with requests of 100 tokens and more;
the folder's 256 would add a third block-table width, i.e. four more programs to compile at start-up, and
requests twice as long, for no property the tests check at 128 too (the widths and pages, the refusals past the
context, the queue and 429s, the freed slot, are the same at any context)."""


def start_server(folder: pathlib.Path, *options: str) -> dict:
    """``onnx2jax serve`` on 127.0.0.1, on a port the server itself had the OS choose (``--port 0``: no race
    with another process for a port chosen beforehand), ready once its start-up line names the port and
    ``/health`` answers 200; waits up to `START_S`, without sleeping longer than needed."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-c", "import sys; from onnx2jax.cli import main; sys.exit(main())", "serve",
               str(folder), "--port", "0", *options]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = _Output(process)
    deadline, url = time.monotonic() + START_S, None
    try:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                time.sleep(0.2)  # the rest of its output
                raise AssertionError(f"the server exited with {process.returncode}:\n{output}")
            if url is None:
                found = next((m for m in map(LISTENING.search, list(output.lines)) if m), None)
                url = found and f"http://127.0.0.1:{found.group(1)}"
            if url is not None:
                try:
                    if httpx.get(f"{url}/health", timeout=30).status_code == 200:
                        return {"url": url, "process": process, "folder": folder, "output": output}
                except httpx.HTTPError:
                    pass
            time.sleep(0.1)
        raise AssertionError(f"the server was not ready within {START_S} s:\n{output}")
    except BaseException:
        process.kill()
        process.wait()
        raise


def stop_server(server: dict) -> None:
    process = server["process"]
    if process.poll() is None:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("served") / "llama_gqa"
    shutil.copytree(GENAI / "llama_gqa", folder)
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    config = json.loads((folder / "genai_config.json").read_text())  # the requests' defaults: sampled at top_k 1
    config["search"].update(do_sample=True, top_k=1)
    (folder / "genai_config.json").write_text(json.dumps(config))
    started = start_server(folder, "--max-batch", "2", "--queue-bound", "3", "--served-model-name", MODEL,
                           "--page-size", "8", "--prefill-chunk", "16", "--context-length", str(CONTEXT))
    yield started
    stop_server(started)


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server['url']}/v1", api_key="unused", max_retries=0, timeout=120)


def _gauges(server) -> dict[str, float]:
    text = httpx.get(f"{server['url']}/metrics", timeout=10).text
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
            if line and not line.startswith("#") and "{" not in line}


def test_openai_client_greedy_tokens_equal_onnxruntime_genai(server):
    client = _client(server)

    def ask(i):
        prompt = EXPECTED["prompts"][i]
        answer = client.completions.create(model=MODEL, prompt=prompt, max_tokens=EXPECTED["max_length"] - len(prompt),
                                           temperature=0)
        return prompt + answer.choices[0].token_ids, answer.choices[0].finish_reason

    # three at once on two slots: one waits. The queue bound is 3, so that none is refused even where the
    # engine's thread has admitted none of them yet when the third comes (under load, a 429 with a bound of 2)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        results = list(pool.map(ask, range(3)))
    assert [r[0] for r in results] == EXPECTED["tokens"]
    assert all(r[1] == "length" for r in results)
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_stream_gives_one_token_per_event_while_the_request_runs(server):
    client = _client(server)
    prompt = EXPECTED["prompts"][0]
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    events = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stream=True))
    tokens = [t for e in events for t in e.choices[0].token_ids]
    assert all(len(e.choices[0].token_ids) == 1 for e in events[:-1])  # one token per event, then the end
    assert tokens == whole.choices[0].token_ids == EXPECTED["tokens"][0][len(prompt):][:12]
    assert "".join(e.choices[0].text for e in events) == whole.choices[0].text
    assert events[-1].choices[0].finish_reason == "length"


def test_requests_default_to_the_folders_search_options(server):
    """The folder's genai_config.json says do_sample true, top_k 1: a request without temperature samples at
    top_k 1, so its tokens are onnxruntime-genai's greedy ones; one that asks top_k 0 samples from all tokens
    (temperature 1 from the folder), and a seed gives the same tokens twice (issue 29 item 2)."""
    client = _client(server)
    prompt = EXPECTED["prompts"][0]
    default = client.completions.create(model=MODEL, prompt=prompt, max_tokens=20)
    assert prompt + default.choices[0].token_ids == EXPECTED["tokens"][0][:len(prompt) + 20]
    unlimited = [client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, seed=5, extra_body={"top_k": 0})
                 .choices[0].token_ids for _ in range(2)]
    assert unlimited[0] == unlimited[1] != default.choices[0].token_ids
    assert "default to genai_config.json's: sampled (temperature 1, top_k 1, top_p 1)" in str(server["output"])


def _counter(server, outcome) -> float:
    text = httpx.get(f"{server['url']}/metrics", timeout=10).text
    return float(next(line.split()[1] for line in text.splitlines() if f'outcome="{outcome}"' in line))


def test_client_disconnecting_mid_stream_frees_its_slot_and_pages(server):
    aborted = _counter(server, "aborted")
    # 12 + 116 = the whole context: the longest the request can run, for the disconnect to be seen while it runs
    body = {"model": MODEL, "prompt": EXPECTED["prompts"][1], "max_tokens": 116, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server['url']}/v1/completions", json=body, timeout=60) as response:
        lines = (line for line in response.iter_lines() if line.startswith("data: "))
        first = json.loads(next(lines)[6:])
        assert first["choices"][0]["token_ids"] == EXPECTED["tokens"][1][12:13]
    # gone after its first token: the request was aborted (so that token came while it ran), its slot and
    # pages are free
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        gauges = _gauges(server)
        if gauges["onnx2jax_slots_used"] == 0 and gauges["onnx2jax_cache_pages_used"] == 0:
            break
        time.sleep(0.1)
    assert gauges["onnx2jax_slots_used"] == 0 and gauges["onnx2jax_cache_pages_used"] == 0
    assert _counter(server, "aborted") == aborted + 1


def _ort_greedy(prompt, steps):
    """Plain onnxruntime greedy, the whole sequence each call (an independent reference)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(GENAI / "llama_gqa" / "model.onnx"), options, providers=["CPUExecutionProvider"])
    tokens = list(prompt)
    for _ in range(steps):
        feeds = {"input_ids": np.array([tokens], np.int64), "attention_mask": np.ones((1, len(tokens)), np.int64)}
        feeds.update({f"past_key_values.{i}.{p}": np.zeros((1, 2, 0, 16), np.float32) for i in (0, 1)
                      for p in ("key", "value")})
        tokens.append(int(np.argmax(session.run(["logits"], feeds)[0][0, -1])))
    return tokens[len(prompt):]


def test_chat_completion_renders_the_folders_template(server):
    messages = [{"role": "user", "content": "the small model"}]
    answer = _client(server).chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0)
    text = jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(TEMPLATE).render(
        messages=messages, add_generation_prompt=True)
    prompt = Tokenizer.from_file(str(GENAI / "llama_gqa" / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    assert answer.choices[0].token_ids == _ort_greedy(prompt, 6)
    assert answer.choices[0].message.role == "assistant" and answer.usage.completion_tokens == 6


def test_chat_without_a_template_is_refused_by_name():
    with pytest.raises(RequestError, match="no chat template"):
        Text(GENAI / "llama_gqa").chat_prompt([{"role": "user", "content": "hi"}])


def test_stop_strings_end_the_text_before_them():
    text = Text(GENAI / "llama_gqa")
    ids = text.encode("the small model writes text", special=False)
    detok = Detokenizer(text, ["writes"])
    pieces = "".join(detok.add([t]) for t in ids)
    assert detok.stopped and pieces == "the small model "


@pytest.mark.parametrize("change, status, field", [
    ({"prompt": [1] * 150}, 400, "prompt"),  # longer than the context of 128
    ({"prompt": [1, 600]}, 400, "prompt"),  # outside the vocabulary of 512
    ({"prompt": [1, -3]}, 400, "prompt"),
    ({"max_tokens": 0}, 400, "max_tokens"),
    ({"max_tokens": 126}, 400, "max_tokens"),  # 3 + 126 tokens: past the context of 128
    ({"temperature": -1}, 400, "temperature"),
    ({"top_p": 0}, 400, "top_p"),
    ({"top_p": 1.5}, 400, "top_p"),
    ({"n": 2}, 400, "n"),
    ({"logprobs": 2}, 400, "logprobs"),
    ({"presence_penalty": 0.5}, 400, "presence_penalty"),
    ({"frobnicate": 1}, 400, "frobnicate"),
    ({"model": "gpt-4"}, 404, "model"),
])
def test_bad_input_is_refused_with_the_reason(server, change, status, field):
    body = {"model": MODEL, "prompt": [1, 17, 230], "max_tokens": 4, "temperature": 0} | change
    response = httpx.post(f"{server['url']}/v1/completions", json=body, timeout=30)
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == field and field in response.json()["error"]["message"]


def test_server_unhurt_and_openai_client_sees_the_refusal(server):
    client = _client(server)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model=MODEL, prompt=[1, 2], max_tokens=2, temperature=-1)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt=[1, 2], max_tokens=2)
    assert client.completions.create(model=MODEL, prompt=[1, 42], max_tokens=2, temperature=0).choices[0].token_ids \
        == EXPECTED["tokens"][2][2:4]


def test_more_requests_than_slots_queue_then_429_with_retry_after(server):
    prompt = EXPECTED["prompts"][2]
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 100, "temperature": 0}
    start = threading.Barrier(16)

    def post(_):
        start.wait()
        return httpx.post(f"{server['url']}/v1/completions", json=body, timeout=120)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:  # 2 slots + 3 in the queue; the rest are refused
        responses = list(pool.map(post, range(16)))
    statuses = sorted(r.status_code for r in responses)
    assert set(statuses) == {200, 429} and statuses.count(200) >= 3, statuses  # 3 wait whatever the timing
    for r in responses:
        if r.status_code == 429:
            assert r.headers["Retry-After"] == "1"
        else:  # none lost: every accepted request has all its tokens, the stored ones first
            tokens = r.json()["choices"][0]["token_ids"]
            assert len(tokens) == 100 and prompt + tokens[:30] == EXPECTED["tokens"][2]


def test_sigterm_finishes_the_request_in_flight_and_exits_0(server):
    process = server["process"]
    body = {"model": MODEL, "prompt": EXPECTED["prompts"][1], "max_tokens": 20, "temperature": 0, "stream": True}
    tokens, finish = [], None
    with httpx.stream("POST", f"{server['url']}/v1/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            tokens += event["choices"][0]["token_ids"]
            finish = event["choices"][0]["finish_reason"] or finish
            if len(tokens) == 1:
                process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0
    assert finish == "length" and EXPECTED["prompts"][1] + tokens == EXPECTED["tokens"][1][:32]
    with pytest.raises(httpx.ConnectError):  # it no longer listens
        httpx.get(f"{server['url']}/health", timeout=5)


@pytest.mark.slow  # its own server: loading and compiling every shape on 2 devices takes a minute on 2 cores
def test_tensor_parallel_server_on_two_devices(tmp_path):
    """``onnx2jax serve --devices 2`` (tensor-parallel, the pages split by KV heads) answers the real openai
    client with onnxruntime-genai's stored greedy tokens, three requests at once and streamed one token per
    event; its folder's repetition_penalty is the requests' default, onnxruntime's tokens with the penalty in
    numpy (issue 29 items 2 and 3)."""
    from test_generate import penalized_greedy

    folder = tmp_path / "llama_gqa"
    shutil.copytree(GENAI / "llama_gqa", folder)
    config = json.loads((folder / "genai_config.json").read_text())
    config["search"]["repetition_penalty"] = 1.3
    (folder / "genai_config.json").write_text(json.dumps(config))
    server = start_server(folder, "--devices", "2", "--max-batch", "2", "--served-model-name", MODEL,
                          "--page-size", "8", "--prefill-chunk", "16", *SHORT_CONTEXT)
    try:
        assert ", 2 devices)" in str(server["output"])
        client = _client(server)

        def ask(i):
            prompt = EXPECTED["prompts"][i]
            answer = client.completions.create(model=MODEL, prompt=prompt, max_tokens=EXPECTED["max_length"] - len(prompt),
                                               temperature=0, extra_body={"repetition_penalty": 1.0})
            return prompt + answer.choices[0].token_ids

        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            assert list(pool.map(ask, range(3))) == EXPECTED["tokens"]
        prompt = EXPECTED["prompts"][1]
        events = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, stream=True,
                                                extra_body={"repetition_penalty": 1.0}))
        assert all(len(e.choices[0].token_ids) == 1 for e in events[:-1])
        assert prompt + [t for e in events for t in e.choices[0].token_ids] == EXPECTED["tokens"][1][:len(prompt) + 12]
        prompt = EXPECTED["prompts"][0]
        penalized = client.completions.create(model=MODEL, prompt=prompt, max_tokens=20)  # the folder's defaults
        assert penalized.choices[0].token_ids == penalized_greedy("llama_gqa", prompt, 20, 1.3)
    finally:
        stop_server(server)


def test_a_small_model_is_served_with_one_xla_cpu_thread(server, tmp_path):
    """XLA's intra-op CPU threads for ``serve``: one for a one-device model under 32 MiB of weight files (its steps
    are shorter than the hand-offs to a second thread), XLA's default (a thread per core) for a larger model or
    tensor-parallel, the user's count where given; the running server says which it asked for."""
    from onnx2jax.cli.options import SMALL_MODEL_BYTES, serve_cpu_threads

    if not os.environ.get("PJRT_NPROC"):  # a count the user set wins, and the line says that one
        assert ", XLA CPU threads 1)" in str(server["output"])
    tiny = str(GENAI / "llama_gqa")
    big = tmp_path / "big"
    big.mkdir()
    with open(big / "model.onnx.data", "wb") as f:
        f.truncate(SMALL_MODEL_BYTES)  # sparse: its size, no disk
    assert [serve_cpu_threads(tiny, None, 1), serve_cpu_threads(str(big), None, 1)] == [1, None]
    assert [serve_cpu_threads(tiny, None, 2), serve_cpu_threads(str(big), 3, 1)] == [None, 3]


@pytest.mark.parametrize("kind", ["completion", "chat"])
@pytest.mark.parametrize("model", ["tiny", 'a "model" named [-12345] \x00piece\x00'])
def test_streamed_events_from_the_template_are_openais_json(kind, model):
    """A token's event is built from a template (no dict or JSON encoding per token); parsed, it is the event
    OpenAI's API defines, whatever the text and the model's name hold."""
    from onnx2jax.serving import openai_api as api

    events = api.StreamEvents(kind, "cmpl-abc", model)
    for piece, token, first, finish in [("x", 5, True, None), ('"\\\n é 中\x00', 17, False, None),
                                        ("", None, False, None), ("end", None, False, "length")]:
        frame = events.event(piece, token, finish, first)
        assert frame.startswith(b"data: ") and frame.endswith(b"\n\n")
        data = json.loads(frame[6:])
        if kind == "completion":
            choice = {"index": 0, "text": piece, "logprobs": None, "finish_reason": finish,
                      "token_ids": [] if token is None else [token]}
        else:
            delta = {"content": piece, **({"role": "assistant"} if first else {})}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish,
                      "token_ids": [] if token is None else [token]}
        assert data == {"id": "cmpl-abc", "object": "text_completion" if kind == "completion" else
                        "chat.completion.chunk", "created": events.created, "model": model, "choices": [choice]}
