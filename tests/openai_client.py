#!/usr/bin/env python3
"""The official `openai` Python client against `shaderlm serve` with the default model (SmolLM2-135M-Instruct).

Starts the server itself on a free loopback port (`--port 0`, the address read from its log) behind an API key,
then checks, greedy: a chat completion (text, finish reason, usage), the same request streamed (the chunks
concatenate to the same text, one finish reason, the usage chunk), a stop string, a text completion, the model
list, and the client's exceptions for a wrong key, an unknown model and a bad field. Stops the server with
Ctrl-C (SIGINT) and requires a clean exit. Run from anywhere: `python3 tests/openai_client.py`; it builds the
binary with `cargo build` first (or takes SHADERLM_BIN).
"""

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

try:
    import openai
except ImportError:
    sys.exit("the openai package is missing: `bash setup.sh --test` installs it (or `python3 -m pip install openai`)")

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ID = "SmolLM2-135M-Instruct.Q4_1"
KEY = "sk-shaderlm-test"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def binary() -> Path:
    if "SHADERLM_BIN" in os.environ:
        return Path(os.environ["SHADERLM_BIN"])
    subprocess.run(["cargo", "build", "--quiet", "--bin", "shaderlm"], cwd=ROOT, check=True)
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    return target / "debug" / ("shaderlm.exe" if os.name == "nt" else "shaderlm")


class Server:
    """`shaderlm serve` on an ephemeral loopback port; its log is kept for failure messages."""

    def __init__(self):
        if not MODEL.exists():
            sys.exit(f"{MODEL} is missing: fetch it with `bash models/fetch.sh`")
        args = [str(binary()), "serve", "-m", str(MODEL), "--port", "0", "--api-key", KEY, "--parallel", "2"]
        env = dict(os.environ, RUST_LOG="warn,shaderlm=info")
        self.proc = subprocess.Popen(args, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
        self.log = []
        self.address = None
        ready = threading.Event()

        def read():
            for line in self.proc.stderr:
                self.log.append(line.rstrip())
                if "listening on http://" in line and self.address is None:
                    self.address = line.split("listening on http://")[1].split()[0]
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(180) or self.address is None:
            self.proc.kill()
            sys.exit("shaderlm serve did not start:\n" + "\n".join(self.log))
        self.url = f"http://{self.address}/v1"

    def stop(self):
        self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("the server did not stop within 30 s of Ctrl-C")
        assert code == 0, f"the server exited with {code} after Ctrl-C:\n" + "\n".join(self.log)


def expect(exception, call, what):
    try:
        call()
    except exception as e:
        return e
    raise AssertionError(f"{what}: expected {exception.__name__}, got an answer")


def check(server: Server):
    client = openai.OpenAI(base_url=server.url, api_key=KEY, max_retries=0, timeout=300)

    ids = [m.id for m in client.models.list().data]
    assert ids == [MODEL_ID], ids

    # Greedy chat, whole.
    whole = client.chat.completions.create(model=MODEL_ID, messages=QUESTION, temperature=0, max_tokens=32)
    choice = whole.choices[0]
    text = choice.message.content
    assert choice.message.role == "assistant"
    assert "Paris" in text, f"SmolLM2 knows the capital of France: {text!r}"
    assert choice.finish_reason == "stop", choice.finish_reason
    usage = whole.usage
    assert usage.prompt_tokens > 10 and 1 <= usage.completion_tokens < 32, usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, usage

    # The same request streamed, with the usage at the end.
    stream = client.chat.completions.create(
        model=MODEL_ID,
        messages=QUESTION,
        temperature=0,
        max_tokens=32,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, finishes, streamed_usage, chunk_ids = [], [], None, set()
    for chunk in stream:
        chunk_ids.add(chunk.id)
        if chunk.usage is not None:
            streamed_usage = chunk.usage
        for c in chunk.choices:
            pieces.append(c.delta.content or "")
            if c.finish_reason is not None:
                finishes.append(c.finish_reason)
    assert len(chunk_ids) == 1, chunk_ids
    assert "".join(pieces) == text, f"streamed {''.join(pieces)!r} != whole {text!r}"
    assert len([p for p in pieces if p]) > 1, f"one piece per token, not one block: {pieces}"
    assert finishes == ["stop"], finishes
    assert streamed_usage is not None, "include_usage: no usage chunk"
    assert (streamed_usage.prompt_tokens, streamed_usage.completion_tokens) == (
        usage.prompt_tokens,
        usage.completion_tokens,
    ), (streamed_usage, usage)

    # A stop string cuts the answer before it.
    cut = client.chat.completions.create(model=MODEL_ID, messages=QUESTION, temperature=0, stop=["Paris"])
    assert cut.choices[0].message.content == text[: text.index("Paris")], cut.choices[0].message.content
    assert cut.choices[0].finish_reason == "stop"

    # A text completion.
    done = client.completions.create(model=MODEL_ID, prompt="The capital of France is", temperature=0, max_tokens=8)
    assert done.choices[0].text.strip(), done
    assert done.choices[0].finish_reason in ("stop", "length")
    assert 1 <= done.usage.completion_tokens <= 8, done.usage

    # The client's exceptions.
    wrong = openai.OpenAI(base_url=server.url, api_key="sk-wrong", max_retries=0)
    expect(openai.AuthenticationError, lambda: wrong.models.list(), "a wrong API key")
    e = expect(
        openai.NotFoundError,
        lambda: client.chat.completions.create(model="gpt-4o", messages=QUESTION),
        "an unknown model",
    )
    assert e.code == "model_not_found", e.body
    e = expect(
        openai.BadRequestError,
        lambda: client.chat.completions.create(model=MODEL_ID, messages=QUESTION, temperature=5),
        "temperature 5",
    )
    assert e.param == "temperature", e.body
    print(f"openai {openai.__version__} against shaderlm serve: all checks passed ({text!r})")


def main():
    server = Server()
    try:
        check(server)
    except BaseException:
        print("server log:\n" + "\n".join(server.log), file=sys.stderr)
        server.proc.kill()
        raise
    server.stop()


if __name__ == "__main__":
    main()
