#!/usr/bin/env python3
"""Record llama.cpp's tokenization of a fixed list of strings, for tests.

Writes
  tests/fixtures/tokenize_strings.json  the input strings (deterministic, below)
  tests/fixtures/tokenize_smollm2.json  {"model_sha256", "llama_cpp_python",
      "cases": [{"text", "ids"}], "pre_variants": {pre: [{"text", "ids"}]}}

The ids come from llama.cpp (through llama-cpp-python), never from our own
tokenizer: ``Llama(path, vocab_only=True).tokenize(text.encode(), add_bos=False,
special=True)``.  "pre_variants" are the same strings tokenized with the SmolLM2
vocabulary and merges but another ``tokenizer.ggml.pre`` value, written into a
vocabulary-only copy of the GGUF, so the pre-tokenizer table entries other than
"smollm" are checked against llama.cpp as well.

Usage:  python scripts/make_tokenizer_fixture.py [MODEL.gguf]
(default: the cached `smollm2` alias, downloaded if needed).  Needs
llama-cpp-python and gguf.

        python scripts/make_tokenizer_fixture.py qwen2.5-coder | gemma3-270m
writes tests/fixtures/tokenize_<name>.json for that model family the same way
(the shared strings plus the family's own markup, llama.cpp's ids, vocabulary
facts), and also: "bos_cases" tokenized with add_bos=True (the way the engine
tokenizes a plain prompt), and for Gemma "variants" (the same vocabulary with
add_space_prefix=True, so that path is checked too) and "chat" (llama.cpp's
built-in "gemma" chat template, as the file has none); for qwen2.5-coder "chat"
is the file's own template rendered by llama-cpp-python's Jinja2ChatFormatter
with the ids it tokenizes that to, and the 0.5B file (same vocabulary) is
tokenized too and must give the same ids.
Run it with the anchor environment:
  /work/venv-anchors/bin/python scripts/make_tokenizer_fixture.py gemma3-270m
"""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"

# Pre-tokenizer names re-checked with the SmolLM2 vocabulary.
PRE_VARIANTS = ("llama-bpe", "qwen2", "gpt-2")


def strings() -> list[str]:
    out: list[str] = []
    add = out.append

    # -- trivial and single characters
    for s in ["", " ", "  ", "\n", "\t", "\r\n", "a", "A", "z", "0", "9", ".", ",", "!", "?",
              "'", '"', "`", "~", "@", "#", "$", "%", "^", "&", "*", "(", ")", "-", "_",
              "=", "+", "[", "]", "{", "}", "\\", "|", ";", ":", "<", ">", "/",
              "é", "ß", "ñ", "中", "あ", "한", "ع", "א", "ж", "λ", "€", "£", "¥", "©",
              "\u00a0", "\u3000", "\u2003", "\u200b", "\ufeff", "\ufffd", "\ue000",
              "\x00", "\x01", "\x1b", "\x7f", "𝔘", "𓀀"]:
        add(s)

    # -- ordinary text and contractions
    add("Hello")
    add("Hello, world!")
    add("hello world")
    add("The quick brown fox jumps over the lazy dog.")
    add("It's a dog's life; they're sure we've seen what I'm saying, you'll see, he'd know.")
    add("don't won't can't shouldn't I'd")
    add("IT'S DON'T THEY'RE WE'VE I'M YOU'LL HE'D")  # case-sensitive in gpt2 split, not in llama3
    add("'s 't 're 've 'm 'll 'd")
    add("'S 'T 'RE 'VE 'M 'LL 'D")
    add("rock'n'roll o'clock ''quoted'' '")
    add("Mr. Smith went to Washington D.C. on Jan. 5th.")
    add("e.g. i.e. etc... -- --- — – …")
    add("CamelCaseIdentifier snake_case_name kebab-case-name SCREAMING_CASE")

    # -- digits and numbers
    for n in range(1, 17):
        add("7" * n)
    for n in (1, 2, 3, 4, 5, 6, 7, 9, 12, 20):
        add("".join(str((i * 7 + 3) % 10) for i in range(n)))
    for s in ["3.14159", "-42", "+1e-10", "1,000,000", "12:30:45", "2024-01-31", "0x1F2E",
              "0b1011", "v1.2.3", "$19.99", "100%", "1st 2nd 3rd 4th", "a1b2c3", " 42", "42 ",
              "x = 123456789", "٣٤٥", "१२३४", "Ⅻ Ⅳ", "½ ¾ ²³", "１２３", "๑๒๓"]:
        add(s)

    # -- whitespace runs: spaces, tabs, newlines, mixed, leading / trailing
    for ws in [" ", "  ", "   ", "    ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", " \n", "\n ",
               " \t ", "\t\n", "\r\n\r\n", "  \n  ", "\n\t\t"]:
        add(ws + "text" + ws + "more" + ws)
    for n in (1, 2, 3, 5, 8, 16):
        add(" " * n)
        add("\n" * n)
    add("\t" * 4)
    add("word\u00a0word\u3000word\u2003word")
    add("line one\r\nline two\rline three\n")

    # -- scripts, accents, combining marks
    for s in [
        "中文文本测试，包括标点符号。",
        "日本語のテキストとカタカナ、ひらがな。",
        "한국어 텍스트 처리 테스트입니다.",
        "مرحبا بالعالم، هذا نص عربي.",
        "שלום עולם",
        "Привет, мир! Ёжик в тумане.",
        "Γειά σου Κόσμε",
        "नमस्ते दुनिया",
        "สวัสดีชาวโลก",
        "Tiếng Việt có dấu: đặc biệt",
        "Ça va? Où est l'hôtel? naïve café résumé",
        "Straße Größe Übermaß",
        "e\u0301 a\u0308 o\u0302 n\u0303",  # combining marks (NFD)
        "é vs e\u0301",
        "a\u0308\u0304\u0323 z\u0336\u0335",
        "Z\u0351\u036b\u0343a\u0310\u0357l\u0341g\u0352o\u0327",  # zalgo
        "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝐛𝐨𝐥𝐝",
        "mixed English 和中文 and العربية together",
        "ﬁ ﬂ ﬀ ligatures",
    ]:
        add(s)

    # -- emoji: single, skin tones, ZWJ sequences, flags, keycaps, variation selectors
    for s in ["😀", "😀😃😄", "👍🏽", "👋🏿 hi", "👨‍👩‍👧‍👦", "👩‍💻", "🏳️‍🌈", "🏴‍☠️",
              "🇫🇷🇯🇵🇺🇸", "🇩🇪 Germany", "1️⃣ 2️⃣", "❤️ ♥ ❤", "I ❤️ NY",
              "emoji at end 🎉", "🎉 at start", "a😀b", "🧑🏾‍🚀 astronaut"]:
        add(s)

    # -- code
    add("def add(a, b):\n    return a + b\n")
    add("class Foo(Bar):\n    def __init__(self):\n        self.x = [1, 2, 3]\n")
    add("for i in range(10):\n\tprint(f\"{i:03d}\")\n")
    add("#include <stdio.h>\nint main(void) {\n    printf(\"%d\\n\", 42);\n    return 0;\n}\n")
    add("if (x != NULL && *x >= 0x7f) { x++; } else { --y; }")
    add('{"name": "colibri", "version": 1, "tags": ["a", "b"], "ok": true, "n": null}')
    add('{\n  "nested": {\n    "deep": [1.5, -2e3]\n  }\n}')
    add("<!DOCTYPE html>\n<html><body><p class=\"x\">Hi &amp; bye</p></body></html>")
    add("<div id='main'>\n  <a href=\"https://example.com\">link</a>\n</div>")
    add("SELECT id, name FROM users WHERE age > 21 ORDER BY name;")
    add("ls -la /tmp && echo $HOME | grep -E '^/root' > out.txt 2>&1")
    add("const f = (x) => x ** 2; // arrow\nlet s = `tpl ${f(3)}`;")
    add("fn main() { let v: Vec<u8> = vec![0; 16]; println!(\"{:?}\", v); }")
    add("^[a-zA-Z0-9_.+-]+@[a-zA-Z0-9-]+\\.[a-zA-Z0-9-.]+$")
    add("# Title\n\n- item *one*\n- item **two**\n\n```python\nx = 1\n```\n")
    add("    indented code\n        more indented\n")
    add("x=1;y=2;z=x+y")

    # -- ChatML markup and special tokens
    add("<|im_start|>user\nHello!<|im_end|>\n")
    add("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        "<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    add("<|im_start|>assistant\n4<|im_end|>")
    add("<|im_start|><|im_end|>")
    add("<|im_start|><|im_start|><|im_end|><|im_end|>")
    add("text<|im_end|>text")
    add(" <|im_end|> ")
    add("<|im_end|>\n\n<|im_start|>")
    add("<|endoftext|>")
    add("before<|endoftext|>after")
    add("<|im_start")
    add("<|im_end|")
    add("|im_start|>")
    add("<|IM_START|>")
    add("<| im_start |>")
    add("<repo_name>colibri<file_sep>main.py<filename>x<gh_stars>10")
    add("<issue_start>bug<issue_comment>fix<issue_closed>")
    add("<jupyter_start><jupyter_text>md<jupyter_code>x=1<jupyter_output>1<empty_output>")
    add("<jupyter_script><reponame>")
    add("<|im_start|>user\n日本語で答えて 😀<|im_end|>\n<|im_start|>assistant\n")
    add("<s></s><unk>[INST] <<SYS>>")

    # -- URLs, emails, paths
    for s in ["https://example.com/path?q=1&r=two#frag",
              "http://127.0.0.1:8080/v1/chat/completions",
              "ftp://user:pass@host.example.org/file.tar.gz",
              "mailto:someone@example.com",
              "user.name+tag@sub.domain.co.uk",
              "/usr/local/lib/python3.11/site-packages/",
              "C:\\Users\\Name\\Documents\\file.txt",
              "~/.cache/colibri-lab/models/SmolLM2-135M-Instruct.Q4_1.gguf",
              "www.example.org", "@user #hashtag"]:
        add(s)

    # -- long repeated characters
    for s in ["a" * 100, "ab" * 60, " " * 50, "\n" * 20, "=" * 80, "-" * 64, "." * 33,
              "😀" * 10, "中" * 40, "0" * 50, "!?" * 25, "\t " * 20, "_" * 30,
              "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"]:
        add(s)

    # -- combinations: whitespace prefix x word kind x suffix
    prefixes = ["", " ", "  ", "\n", "\t"]
    words = ["word", "123", "!!", "é", "中文", "'s", "😀"]
    suffixes = ["", " ", "\n"]
    for p, w, s in itertools.product(prefixes, words, suffixes):
        add(p + w + s)

    # de-duplicate, keeping first occurrences (the order is part of the fixture)
    seen: set[str] = set()
    uniq = []
    for s in out:
        if s not in seen:
            seen.add(s)
            uniq.append(s)
    return uniq


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _vocab_only_copy(src: Path, dest: Path, pre: str | None = None, **overrides) -> None:
    """Write a tensor-less GGUF with src's metadata, tokenizer.ggml.pre = pre
    (if given) and the other keys in ``overrides`` (existing keys only)."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    if pre is not None:
        overrides["tokenizer.ggml.pre"] = pre
    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(str(dest), arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = overrides[key] if key in overrides else field.contents()
        vtype = field.types[0]
        if vtype == GGUFValueType.ARRAY:
            writer.add_key_value(key, value, vtype, sub_type=field.types[-1])
        else:
            writer.add_key_value(key, value, vtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _tokenize_all(path: Path, texts: list[str], add_bos: bool = False) -> list[dict]:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    cases = []
    for t in texts:
        ids = llm.tokenize(t.encode("utf-8"), add_bos=add_bos, special=True)
        cases.append({"text": t, "ids": [int(i) for i in ids]})
    del llm
    return cases


def _vocab_facts(path: Path, texts: list[str]) -> dict:
    """Special ids, end-of-generation ids, token pieces and special=False ids, from llama.cpp."""
    import ctypes

    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n = llama_cpp.llama_vocab_n_tokens(vocab)
    buf = ctypes.create_string_buffer(256)

    def piece(i: int, special: bool) -> str:
        k = llama_cpp.llama_token_to_piece(vocab, i, buf, len(buf), 0, special)
        if k < 0:
            raise RuntimeError(f"token {i}: piece longer than {len(buf)} bytes")
        return buf.raw[:k].hex()

    control = [i for i in range(n) if llama_cpp.llama_vocab_is_control(vocab, i)]
    # Control tokens (the first 300: Gemma has 6,000 <unusedN>), then a fixed
    # stride through the vocabulary.
    sample = sorted(set(control[:300]) | set(range(0, n, 97)) | {n - 1})
    facts = {
        "n_vocab": n,
        "bos": llama_cpp.llama_vocab_bos(vocab),
        "eos": llama_cpp.llama_vocab_eos(vocab),
        "eog": [i for i in range(n) if llama_cpp.llama_vocab_is_eog(vocab, i)],
        "control": control,
        # [id, hex bytes with special=True, hex bytes with special=False]
        "pieces": [[i, piece(i, True), piece(i, False)] for i in sample],
        # special=False: control-token text is tokenized as plain text
        "plain_cases": [
            {"text": t, "ids": [int(x) for x in llm.tokenize(t.encode("utf-8"), add_bos=False,
                                                           special=False)]}
            for t in texts if "<" in t
        ],
    }
    del llm
    return facts


# -- the real models of issue 21 ---------------------------------------------------

FAMILIES = {
    # fixture name -> (alias, aliases whose files must give the same ids)
    "qwen2.5-coder": ("qwen2.5-coder-1.5b", ("qwen2.5-coder-0.5b",)),
    "gemma3-270m": ("gemma3-270m", ()),
}

QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def family_strings(name: str) -> list[str]:
    """The shared strings plus this family's chat / tool / FIM markup."""
    if name == "qwen2.5-coder":
        extra = [
            f"<|im_start|>system\n{QWEN_SYSTEM}<|im_end|>\n<|im_start|>user\n"
            "Write a Python function that reverses a string.<|im_end|>\n<|im_start|>assistant\n",
            "<|im_start|>assistant\n```python\ndef rev(s: str) -> str:\n    return s[::-1]\n```<|im_end|>\n",
            "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n    return c<|fim_middle|>",
            "<|fim_pad|><|repo_name|>colibri<|file_sep|>main.py\nimport os",
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
            "<tools>\n{\"type\": \"function\"}\n</tools>",
            "<|im_start|>user\n<tool_response>\n22 C\n</tool_response><|im_end|>",
            "<|endoftext|><|im_end|><|im_start|>",
            "<|vision_start|><|image_pad|><|vision_end|>",
            "<|object_ref_start|>x<|object_ref_end|><|box_start|>(1,2)<|box_end|>",
            "    def method(self, x: int = 1_000_000) -> None:\n        pass\n",
            "x = 12345678901234567890 + 3.14159265358979",
            "\t\tif (a && b) {\n\t\t\treturn;\n\t\t}\n",
            "<|im_start|>user\n你好，请用中文回答。<|im_end|>\n",
        ]
    else:
        extra = [
            "<start_of_turn>user\nHello!<end_of_turn>\n<start_of_turn>model\n",
            "<bos><start_of_turn>user\nYou are terse.\n\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n4<end_of_turn>\n",
            "<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "[multimodal]", "<start_of_image>", "<end_of_image>",
            "<unused0><unused99><unused6241>", "<start_of_turn><end_of_turn>", "text<end_of_turn>text",
            "</s>", "<s>struck</s> text", "<b>bold</b> <i>it</i> <code>x</code>",
            "<table><tr><td>1</td><td>2</td></tr></table>", "<h1>Title</h1>\n<ul><li>a</li></ul>",
            "<0x41><0x0A>", "\u2581", "\u2581\u2581word\u2581", "a\u2581b c",
            " " * 31, " " * 32, " " * 40, "\t" * 31, "\t" * 33, "\n" * 31, "\n" * 40,
            " \t \n \t\t\n\n  x", "x" + " " * 7 + "y" + "\t" * 3 + "z",
            "def f(x):\n\treturn x  # tab indent\n", "    four\n        eight\n",
            "ÀÉÎÕÜ àéîõü ĀĒĪŌŪ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "\U0001f9d1\u200d\U0001f52c",
            "\x00\x01\x02\x7f", "\ue000\uf8ff",
        ]
    out = strings()
    for t in extra:
        if t not in out:
            out.append(t)
    return out


def _chat_cases_gemma() -> list[dict]:
    """llama.cpp's built-in "gemma" template on a few conversations."""
    import ctypes

    import llama_cpp

    convs = [
        [{"role": "user", "content": "Hello!"}],
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"}],
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, how can I help?"},
         {"role": "user", "content": "Write a haiku."}],
        [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "  spaces  "},
         {"role": "assistant", "content": "\nD'accord.\n"}, {"role": "user", "content": "Merci"}],
    ]
    cases = []
    for msgs in convs:
        for add_ass in (True, False):
            arr = (llama_cpp.llama_chat_message * len(msgs))()
            keep = []
            for k, m in enumerate(msgs):
                role, content = m["role"].encode(), m["content"].encode()
                keep += [role, content]
                arr[k].role, arr[k].content = role, content
            buf = ctypes.create_string_buffer(8192)
            n = llama_cpp.llama_chat_apply_template(b"gemma", arr, len(msgs), add_ass, buf, len(buf))
            if n < 0 or n > len(buf):
                raise RuntimeError(f"llama_chat_apply_template failed ({n})")
            cases.append({"messages": msgs, "add_generation_prompt": add_ass,
                          "text": buf.raw[:n].decode("utf-8")})
    return cases


def _chat_cases_qwen(path: Path) -> list[dict]:
    """The file's own template rendered by llama-cpp-python's Jinja2ChatFormatter
    (what its create_chat_completion sends), and the ids it tokenizes that to."""
    import llama_cpp
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    meta = llm.metadata
    vocab = llama_cpp.llama_model_get_vocab(llm.model)

    def text(i: int) -> str:
        return llama_cpp.llama_vocab_get_text(vocab, i).decode("utf-8")

    bos = text(llama_cpp.llama_vocab_bos(vocab))
    eos = text(llama_cpp.llama_vocab_eos(vocab))
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
    convs = [
        ([{"role": "user", "content": "Write a function."}], None),
        ([{"role": "system", "content": "Only code."}, {"role": "user", "content": "Sort a list."}], None),
        ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
          {"role": "user", "content": "  and now?  "}], None),
        ([{"role": "user", "content": "Weather in Paris?"}], tools),
        ([{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather in Paris?"}, call,
          {"role": "tool", "content": "22 C"}, {"role": "tool", "content": "sunny"}], tools),
    ]
    cases = []
    for msgs, tls in convs:
        for gen in (True, False):
            fmt = Jinja2ChatFormatter(meta["tokenizer.chat_template"], eos_token=eos, bos_token=bos,
                                      add_generation_prompt=gen)
            prompt = fmt(messages=msgs, tools=tls).prompt
            ids = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
            cases.append({"messages": msgs, "tools": tls, "add_generation_prompt": gen,
                          "text": prompt, "ids": [int(i) for i in ids]})
    del llm
    return cases


def main_family(name: str) -> int:
    import llama_cpp

    sys.path.insert(0, str(ROOT))
    from colibri_lab.models import resolve

    alias, same = FAMILIES[name]
    model = resolve(alias, pull=True)
    texts = family_strings(name)
    cases = _tokenize_all(model, texts)
    also = []
    for other in same:
        path = resolve(other, pull=True)
        if _tokenize_all(path, texts) != cases:
            raise SystemExit(f"{other} tokenizes differently from {alias}: give it its own fixture")
        also.append({"model": path.name, "model_sha256": _sha256(path)})
    bos_texts = ["", "Hello", " Hello", "<bos>Hello", "<|im_start|>user\nHi<|im_end|>\n",
                 "<start_of_turn>user\nHi<end_of_turn>\n", "\n", "  x"]
    result = {
        "model": model.name,
        "model_sha256": _sha256(model),
        "same_ids": also,
        "llama_cpp_python": llama_cpp.__version__,
        "call": "Llama(path, vocab_only=True).tokenize(text.encode(), add_bos=False, special=True)",
        "cases": cases,
        # add_bos=True: BOS as the model's metadata asks (what the engine does for a plain prompt)
        "bos_cases": _tokenize_all(model, bos_texts, add_bos=True),
        "vocab": _vocab_facts(model, texts),
        "variants": {},
    }
    if name == "gemma3-270m":
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / "vocab-space-prefix.gguf"
            _vocab_only_copy(model, copy, **{"tokenizer.ggml.add_space_prefix": True})
            result["variants"]["add_space_prefix"] = _tokenize_all(copy, texts)
        result["chat"] = _chat_cases_gemma()
    else:
        result["chat"] = _chat_cases_qwen(model)
    out = FIXTURES / f"tokenize_{name}.json"
    lines = ["{"]
    for key in ("model", "model_sha256", "same_ids", "llama_cpp_python", "call"):
        lines.append(f"  {json.dumps(key)}: {json.dumps(result[key], ensure_ascii=False)},")
    for key in ("cases", "bos_cases"):
        lines.append(f'  "{key}": [')
        lines.append(",\n".join("    " + json.dumps(c, ensure_ascii=False) for c in result[key]))
        lines.append("  ],")
    if "chat" in result:
        lines.append(f'  "chat": {json.dumps(result["chat"], ensure_ascii=False)},')
    lines.append(f'  "vocab": {json.dumps(result["vocab"], ensure_ascii=False)},')
    lines.append('  "variants": {')
    body = []
    for k, v in result["variants"].items():
        body.append(f"    {json.dumps(k)}: [\n"
                    + ",\n".join("      " + json.dumps(c, ensure_ascii=False) for c in v) + "\n    ]")
    lines.append(",\n".join(body))
    lines.append("  }")
    lines.append("}")
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    json.loads(out.read_text(encoding="utf-8"))  # the hand-joined JSON must parse
    print(f"wrote {len(texts)} strings to {out} (llama-cpp-python {llama_cpp.__version__})")
    return 0


def main(argv: list[str]) -> int:
    import llama_cpp

    if len(argv) > 1 and argv[1] in FAMILIES:
        return main_family(argv[1])
    if len(argv) > 1:
        model = Path(argv[1])
    else:
        sys.path.insert(0, str(ROOT))
        from colibri_lab.models import resolve

        model = resolve("smollm2", pull=True)
    texts = strings()
    FIXTURES.mkdir(parents=True, exist_ok=True)
    (FIXTURES / "tokenize_strings.json").write_text(
        json.dumps({"strings": texts}, ensure_ascii=False, indent=0) + "\n", encoding="utf-8"
    )
    result = {
        "model": model.name,
        "model_sha256": _sha256(model),
        "llama_cpp_python": llama_cpp.__version__,
        "call": "Llama(path, vocab_only=True).tokenize(text.encode(), add_bos=False, special=True)",
        "cases": _tokenize_all(model, texts),
        "vocab": _vocab_facts(model, texts),
        "pre_variants": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for pre in PRE_VARIANTS:
            copy = Path(tmp) / f"vocab-{pre}.gguf"
            _vocab_only_copy(model, copy, pre)
            result["pre_variants"][pre] = _tokenize_all(copy, texts)
    out = FIXTURES / "tokenize_smollm2.json"
    # One case per line: readable diffs when llama.cpp's behaviour changes.
    lines = ["{"]
    for key in ("model", "model_sha256", "llama_cpp_python", "call"):
        lines.append(f"  {json.dumps(key)}: {json.dumps(result[key], ensure_ascii=False)},")

    def dump_cases(cases: list[dict], indent: str) -> list[str]:
        body = [indent + json.dumps(c, ensure_ascii=False) for c in cases]
        return [",\n".join(body)]

    lines.append('  "cases": [')
    lines += dump_cases(result["cases"], "    ")
    lines.append("  ],")
    lines.append(f'  "vocab": {json.dumps(result["vocab"], ensure_ascii=False)},')
    lines.append('  "pre_variants": {')
    for k, pre in enumerate(PRE_VARIANTS):
        lines.append(f"    {json.dumps(pre)}: [")
        lines += dump_cases(result["pre_variants"][pre], "      ")
        lines.append("    ]" + ("," if k + 1 < len(PRE_VARIANTS) else ""))
    lines.append("  }")
    lines.append("}")
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    json.loads(out.read_text(encoding="utf-8"))  # the hand-joined JSON must parse
    print(f"wrote {len(texts)} strings to {out} (llama-cpp-python {llama_cpp.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
