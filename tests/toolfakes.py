"""Fixtures for tool-call tests: the Qwen2.5 chat template (its tools section writes the format
runtime/text/toolcalls.py parses) and a byte-level tokenizer of 64 one-character tokens plus the
`<tool_call>` / `</tool_call>` tags as ordinary (not special) added tokens, as Qwen2.5's
tokenizer has them, so decoding keeps the tags and llguidance reads their bytes."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from specrt.runtime.bundle.manifest import TokenizerInfo

# Qwen2.5-Instruct's chat template (tokenizer_config.json of the Qwen2.5 instruct models)
QWEN25_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

# the same shape in few tokens (the fake's context is 256): tool names in the system turn, calls
# in the assistant's, results as a user turn
MINI_TEMPLATE = r"""{%- if tools %}<|im_start|>system
{% for t in tools %}{{ t.function.name }} {% endfor %}<tool_call><|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == "tool" %}<|im_start|>user
<tool_response>{{ m.content }}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content or "" }}{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.arguments | tojson }}</tool_call>{% endfor %}<|im_end|>
{% endif %}
{%- endfor %}<|im_start|>assistant
"""

SPECIAL = ["<unk>", "<|im_start|>", "<|im_end|>"]
TAGS = ["<tool_call>", "</tool_call>"]
CHARS = ["\u010a", "\u0120", *'{}[]":,', *"0123456789", *"abcdefghijklmnopqrstuvwxyz", *"_.-`", *"ABCDEFGHIJ"]
VOCAB = len(SPECIAL) + len(TAGS) + len(CHARS)
EOS = 2  # <|im_end|>
OPEN_ID, CLOSE_ID = 3, 4
assert VOCAB == 64, VOCAB


def write_tool_tokenizer(folder: Path, template: str | None = QWEN25_TEMPLATE) -> TokenizerInfo:
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    vocab = {t: i for i, t in enumerate(SPECIAL + TAGS + CHARS)}
    tk = HFTokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens(SPECIAL)
    tk.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAGS])
    folder.mkdir(parents=True, exist_ok=True)
    tk.save(str(folder / "tokenizer.json"))
    return TokenizerInfo(bos_token_id=None, eos_token_ids=[EOS], pad_token_id=0, chat_template=template)


def tool_tokens(template: str | None = QWEN25_TEMPLATE):
    """fakes.fake_parts' `tokens`: this tokenizer with `template` as the chat template."""
    return VOCAB, lambda folder: write_tool_tokenizer(folder, template)


def ids(text: str) -> list[int]:
    """Text of tags and CHARS -> token ids (the tags as their single tokens)."""
    out, i = [], 0
    while i < len(text):
        tag = next((t for t in TAGS if text.startswith(t, i)), None)
        if tag:
            out.append(len(SPECIAL) + TAGS.index(tag))
            i += len(tag)
            continue
        c = {"\n": "\u010a", " ": "\u0120"}.get(text[i], text[i])
        out.append(len(SPECIAL) + len(TAGS) + CHARS.index(c))
        i += 1
    return out


def tool_bundle(bundle: Path, dest: Path) -> Path:
    """A copy of a real bundle (its files linked) whose chat template is Qwen2.5's: a real model
    and tokenizer with a tool section (the tags are text to this tokenizer)."""
    import json

    dest.mkdir(parents=True, exist_ok=True)
    for f in bundle.iterdir():
        if f.name != "specrt.json":
            (dest / f.name).symlink_to(f.resolve())
    man = json.loads((bundle / "specrt.json").read_text())
    man["name"] = dest.name
    man["tokenizer"]["chat_template"] = QWEN25_TEMPLATE
    (dest / "specrt.json").write_text(json.dumps(man, indent=1))
    return dest


class ToolServer:
    """uvicorn in a thread over a pipeline the test also calls directly (the tool tests of
    tests/runtime/serve and tests/tools share it)."""

    def __init__(self, pipe, model="fake"):
        import openai
        import uvicorn

        from specrt.runtime.serve.app import ServerConfig, build_app

        self.pipe, self.model = pipe, model
        self.server = uvicorn.Server(uvicorn.Config(build_app(ServerConfig(model_id=model), lambda: pipe),
                                                    host="127.0.0.1", port=0, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not (self.server.started and pipe.engine is not None) and time.time() < deadline:
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        while self.client.with_options(timeout=1).models.list() is None:  # loads in a thread: 503 until then
            time.sleep(0.02)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(10)
        self.pipe.close()
