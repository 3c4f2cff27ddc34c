"""`lab-tiny`: a Llama built from a config, with a word- and phrase-level tokenizer made offline from the lab
world's texts, to be trained from scratch on the hidden-rules lab world (`benchmarks.lab.hidden`) in minutes.

Why not subwords. Every item, shelf letter, digit, tool and keyword is one token, so copying an item name from
the instruction into a call is copying one token, not a sequence of byte-level BPE pieces (small Llamas with
BPE tokenizers and ~250-token prompts never learned that copy here; a word-level probe learned unstated
rules in minutes). A hidden-rules test prompt is 43 to 63 tokens with its tools line (`lab_tiny_pattern`).

The tokenizer (`build_lab_tokenizer`) is a `tokenizers` ``WordLevel`` model whose pre-tokenizer
(`lab_tiny_pattern`) cuts text at the world's entities (items, docks, single capital letters: what a call
copies from the prompt or an output), digits and JSON keys, and keeps the prompts' template text between two
entities as one phrase (``Move the ``, `` to the shelf where the ``); text no phrase covers falls back to words
and punctuation runs with the spaces beside them. An item is the same token in prose (``Ship the hammer``)
and in a call's JSON (``"item": "hammer"``). Its decoder joins pieces with nothing between them (``Fuse``),
so ``decode(encode(t)) == t`` for any text made of known pieces. The vocabulary is every piece of the texts
the world can show or be answered with (`lab_vocabulary`: the chat template's words, the train stream's
prompts, calls, closing messages, outputs and the error outputs of common mistakes, split with the phrases
and with the word-level fallback alone), plus every item name, letter and digit; a piece outside it is
``[UNK]``. Special tokens: one per role (``<|system|>``, ``<|user|>``, ``<|assistant|>``, ``<|tool|>``),
``<|end|>`` (end of a message: EOS and padding), ``[UNK]``; the fixed parts of a Hermes call (`_ADDED`) are
added tokens that are not special (they must survive ``skip_special_tokens``).

The chat template (`LAB_TINY_CHAT_TEMPLATE`) writes ``<|role|>content<|end|>`` per message and the tools as one
line of names in the first system message (``Tools: locate list_shelf move pack ship``); it renders
``tools`` (so `envace_gym.rendering` never adds the long Hermes tool prompt).

The model (`lab_tiny_model`) is a ``LlamaForCausalLM`` with tied embeddings, initialised from ``seed`` in a
forked RNG, its attention layers initialised mimetically (`mimetic_attention_init`: each starts as a copy),
without which it learned to copy items into calls one task family at a time. The named model ``lab-tiny`` is
the default sizes with seed 0, built once into ``<cache>/models/lab-tiny-<hash>/`` like the other cached models
(`agents.models.ensure_lab_tiny_model`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

__all__ = [
    "LAB_TINY_MODEL",
    "lab_tiny_pattern",
    "LAB_TINY_CHAT_TEMPLATE",
    "LabTinySizes",
    "lab_vocabulary",
    "lab_phrases",
    "build_lab_tokenizer",
    "mimetic_attention_init",
    "lab_tiny_model",
    "lab_tiny_dir",
    "build_lab_tiny",
]


LAB_TINY_MODEL = "lab-tiny"


def _entity_pattern() -> str:
    """An entity (`benchmarks.lab.tasks.ITEMS`, `benchmarks.lab.world.DOCKS`, or one capital letter) not inside a
    longer word."""
    from benchmarks.lab.tasks import ITEMS
    from benchmarks.lab.world import DOCKS

    names = "|".join(sorted({*ITEMS, *DOCKS}, key=lambda n: (-len(n), n)))
    return rf"(?<![A-Za-z_])(?:{names}|[A-Z])(?![A-Za-z_])"


_JSON_KEY = r'(?<![A-Za-z_])[A-Za-z_]+": ?"?'
"""A JSON key with its closing quote, colon and the value's opening quote (``item": "``, ``free": ``): one
token, so a value's key is the token right before it in a call and in an output alike."""


def _word_pattern(phrases: tuple[str, ...] = ()) -> str:
    """The split, first match wins: entity, digit, JSON key (`_JSON_KEY`), then each of `phrases` (literal text,
    in the order given), then the word-level fallback: a run of letters and underscores with at most one space
    on each side, a run of punctuation likewise, a run of whitespace. With no phrases, the fallback alone."""
    entity = _entity_pattern()
    literal = "".join(f"{_literal(p)}|" for p in phrases)
    return rf"{entity}|\d|{_JSON_KEY}|{literal} ?(?!{entity})[A-Za-z_]+ ?| ?[^\w\s]+ ?|\s+"


def _literal(text: str) -> str:
    r"""`text` as an Oniguruma literal: letters, digits and spaces as themselves, every other character as
    ``\x{hex}`` (so quotes, braces and newlines need no escaping rules)."""
    return "".join(c if c.isalnum() or c == " " else f"\\x{{{ord(c):x}}}" for c in text)


@functools.lru_cache(maxsize=1)
def lab_phrases() -> tuple[str, ...]:
    """The world's phrases: every maximal run of text between two entities or digits in the prompts (system and
    user messages) of 50 train tasks per family that holds a letter, longest first (``" to the shelf where the "``,
    ``"Move the "``, ``" on shelf "``). The prompts are templates, so there are about 15. Calls and outputs get
    no phrases: their JSON keys are pieces of their own (`_JSON_KEY`), so an output can repeat a call's value by
    matching the key before it."""
    import re

    split = re.compile(rf"{_entity_pattern()}|\d")  # prompts hold no special or added token
    spans = {span for text in _prompt_texts(50) for span in split.split(text) if any(c.isalpha() for c in span)}
    return tuple(sorted(spans, key=lambda t: (-len(t), t)))


@functools.lru_cache(maxsize=1)
def lab_tiny_pattern() -> str:
    """The pre-tokenizer's regular expression (Oniguruma, as `tokenizers` compiles it), first match wins:

    1. an entity (`_entity_pattern`), without spaces;
    2. one digit;
    3. a JSON key with its punctuation (`_JSON_KEY`: ``item": "``);
    4. one of the prompts' phrases (`lab_phrases`), longest first;
    5. the word-level fallback (`_word_pattern`): a word or a punctuation run with the spaces beside it, a run
       of whitespace.

    So the text between two entities of a prompt is one token: ``Move the |lamp| to the shelf where the |drill|
    is. If that shelf is full, put the |lamp| on shelf |B|.`` is 9 tokens, and the token before an item says
    which item of the instruction it is (the one to move, the one whose shelf is the target); a call is
    ``<open>|move|<args>|item": "|lamp|", "|shelf": "|C|<close>`` and its output ``{"|item": "|lamp|...``, so
    the output's item follows the same token as the call's. Why: a prompt is about a fifth shorter (a test
    prompt 52 tokens on average with its tools line, against 66 with words alone), and both copies need one token of
    context to find their value rather than two.
    """
    return _word_pattern(lab_phrases())


_SPECIAL = ["[UNK]", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]
_ADDED = ['<tool_call>\n{"name": "', '", "arguments": {"', '"}}\n</tool_call>', '", "', "<tool_call>", "</tool_call>"]
"""Added tokens (matched in raw text before the pre-tokenizer, longest first): the fixed parts of a Hermes
call and JSON's ``", "``, so a call is about 6 tokens (``<open> pack <args> item": " mirror <close>``) instead
of 26 and an item is still one token."""
LAB_TINY_CHAT_TEMPLATE = (
    "{%- if tools -%}<|system|>"
    "{%- if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n{% endif -%}"
    "Tools:{% for t in tools %} {{ t['function']['name'] }}{% endfor %}<|end|>"
    "{%- endif -%}"
    "{%- for message in messages -%}{%- if not (tools and loop.first and message['role'] == 'system') -%}"
    "<|{{ message['role'] }}|>{{ message['content'] }}<|end|>"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt %}<|assistant|>{% endif -%}"
)
_VERSION = "v7"  # bump when the build changes in a way the folder hash does not see


@dataclasses.dataclass(frozen=True)
class LabTinySizes:
    """The Llama config fields `lab_tiny_model` sets (the rest are Transformers' defaults).

    Attributes:
        hidden_size: width (divisible by `num_attention_heads`).
        num_hidden_layers: decoder layers.
        num_attention_heads: heads (key/value heads the same: no grouping at this size). Two of width 64 rather
            than four of 32: a head that copies a value maps it through its value/output matrices, of rank at
            most the head width, and the world has ~45 values to copy (24 items, 4 docks, letters, digits);
            with four heads `lab-tiny` learned to copy letters and digits but not items in 600 SFT steps,
            with two it began copying docks and items (one initialisation each; `benchmarks.experiments.lab_tiny_sft`).
        intermediate_size: MLP width.
        max_position_embeddings: longest sequence in tokens (RoPE needs no table, this only bounds use).
        mimetic_init: start every attention layer as a copy (`mimetic_attention_init`) rather than from
            Transformers' normal initialisation.
    """

    hidden_size: int = 128
    num_hidden_layers: int = 4
    num_attention_heads: int = 2
    intermediate_size: int = 384
    max_position_embeddings: int = 1024
    mimetic_init: bool = True

    def __post_init__(self) -> None:
        sizes = (
            self.hidden_size,
            self.num_hidden_layers,
            self.num_attention_heads,
            self.intermediate_size,
            self.max_position_embeddings,
        )
        if min(sizes) < 1 or self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"LabTinySizes: sizes must be >= 1 and hidden_size divisible by num_attention_heads, got {self}"
            )


def _pieces(texts: Iterable[str]) -> set[str]:
    """The pieces of `texts` under `lab_tiny_pattern` and under the word-level fallback alone (so text that no
    phrase covers still splits into known pieces)."""
    import tokenizers

    splits = [
        tokenizers.pre_tokenizers.Split(tokenizers.Regex(p), behavior="isolated")
        for p in (lab_tiny_pattern(), _word_pattern())
    ]
    return {piece for text in texts for split in splits for piece, _ in split.pre_tokenize_str(text)}


def _prompt_texts(train_tasks: int) -> Iterable[str]:
    """The prompts (system and user messages) of `train_tasks` tasks of each hidden-rules family from the train
    stream."""
    from benchmarks.lab import LabSuite

    suite = LabSuite()
    stream = suite.train_stream()
    for _ in range(train_tasks * len(suite.categories)):
        yield from (m.content for turn in next(stream).turns for m in turn)


def _world_texts(train_tasks: int) -> Iterable[str]:
    """Every text the lab world shows over `train_tasks` tasks of each hidden-rules family from the train stream
    (prompts, reference calls, their real outputs, closing messages), the error outputs of common mistakes,
    and every item, letter and digit."""
    import string

    from benchmarks.lab import LabSuite
    from benchmarks.lab.tasks import ITEMS
    from benchmarks.lab.world import DISTRACTOR_TOOLS, DOCKS, HIDDEN_TOOLS
    from envace_gym.parsing import format_tool_calls
    from envace_gym.suites import DONE_MESSAGE, NO_CALL_MESSAGE
    from envace_gym.types import ToolCall

    suite = LabSuite()
    yield from (
        DONE_MESSAGE,
        NO_CALL_MESSAGE,
        *ITEMS,
        *DOCKS,
        *string.ascii_uppercase,
        *string.digits,
        *HIDDEN_TOOLS,
        *DISTRACTOR_TOOLS,
    )
    stream = suite.train_stream()
    for _ in range(train_tasks * len(suite.categories)):
        task = next(stream)
        yield from (m.content for turn in task.turns for m in turn)
        yield "\nTools:" + "".join(f" {tool.name}" for tool in task.tools)  # the chat template's tools line
        backend = suite.make_backend(task)
        shelves = string.ascii_uppercase[: suite.config.num_shelves]
        looks = [ToolCall("list_shelf", {"shelf": s}) for s in shelves] + [ToolCall("inventory", {})]
        looks += [ToolCall("count_items", {"shelf": s}) for s in shelves]
        yield from (backend.execute(c) for c in looks)  # every shelf as it starts (an empty one included)
        for call in (c for turn in suite.ground_truth(task) for c in turn):
            yield format_tool_calls([call], "hermes")
            yield backend.execute(call)
        mistakes = [
            ToolCall("move", {"item": "apple", "shelf": "A"}),
            ToolCall("pack", {"item": "unicorn"}),
            ToolCall("ship", {"box": "A9-9", "dock": "north"}),
            ToolCall("list_shelf", {"shelf": "Z"}),
            ToolCall("locate", {"item": "unicorn"}),
            ToolCall("ship", {"box": "A1-1", "dock": "moon"}),
            ToolCall("move", {"item": "unicorn", "shelf": "A"}),
            ToolCall("move", {}),
        ]
        for call in mistakes:
            yield backend.execute(call)
        for item in ITEMS:  # every item's errors and every shelf's move onto it (a full one breaks the item)
            for shelf in string.ascii_uppercase[: suite.config.num_shelves]:
                yield backend.execute(ToolCall("move", {"item": item, "shelf": shelf}))
            yield backend.execute(ToolCall("pack", {"item": item}))
            yield backend.execute(ToolCall("locate", {"item": item}))
        for box in list(backend.state.boxes):
            yield backend.execute(ToolCall("ship", {"box": box, "dock": "north"}))
            yield backend.execute(ToolCall("ship", {"box": box, "dock": "north"}))  # shipped twice
        yield from (backend.execute(c) for c in looks)  # and every shelf emptied


def lab_vocabulary(train_tasks: int = 50) -> list[str]:
    """The vocabulary (module docstring): special tokens first, then the pieces sorted.

    Args:
        train_tasks: train-stream tasks per family whose texts are split (no test task is read).
    """
    pieces = sorted(_pieces(_world_texts(train_tasks)))
    return _SPECIAL + _ADDED + [p for p in pieces if p not in _SPECIAL and p not in _ADDED]


@functools.lru_cache(maxsize=1)
def _vocabulary_once() -> tuple[str, ...]:
    return tuple(lab_vocabulary())


def build_lab_tokenizer(vocabulary: list[str] | None = None) -> PreTrainedTokenizerFast:
    """The tokenizer over `vocabulary` (None: `lab_vocabulary()`), with `LAB_TINY_CHAT_TEMPLATE`.

    Returns:
        A ``PreTrainedTokenizerFast``: eos and pad ``<|end|>``, unk ``[UNK]``, no bos; saved and loaded like
        any Transformers tokenizer.
    """
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocabulary = list(vocabulary) if vocabulary is not None else list(_vocabulary_once())
    tok = tokenizers.Tokenizer(models.WordLevel({p: i for i, p in enumerate(vocabulary)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(tokenizers.Regex(lab_tiny_pattern()), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False) for t in _SPECIAL])
    tok.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False) for t in _ADDED])
    out = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|end|>",
        pad_token="<|end|>",
        unk_token="[UNK]",
        clean_up_tokenization_spaces=False,
    )
    out.chat_template = LAB_TINY_CHAT_TEMPLATE
    return out


MIMETIC_VO = 0.5
MIMETIC_QK = 0.3


def mimetic_attention_init(
    model: PreTrainedModel, generator: Any, vo: float = MIMETIC_VO, qk: float = MIMETIC_QK
) -> None:
    """Set every Llama attention layer of `model` so it starts as a copy of the tokens it attends to (in place).

    Mimetic initialisation (Trockman & Kolter, "Mimetic Initialization of Self-Attention Layers", ICML 2023):
    per layer, with ``O1``, ``O2`` random ``(H, H)`` orthogonal matrices (H the width, all heads together),
    ``W_V = sqrt(vo) O1^T``, ``W_O = sqrt(vo) O1`` so ``W_O W_V = vo I`` (a head passes the attended token's
    embedding through: with tied embeddings, a copy), and ``W_Q = W_K = sqrt(qk) O2^T`` so ``W_Q^T W_K = qk I``
    (a query prefers keys like itself, before RoPE's rotation). The paper pairs the V/O identity with a negative
    sign for vision; a language model copies, so it is positive here. Why: with Transformers' normal
    initialisation (std 0.02) `lab-tiny` learned to copy an item from the prompt into a call in one task
    family at a time (a phase change every few hundred steps, each family undoing the last); mimetically
    initialised, it copied items in every family within 300 steps of mixed batches (one initialisation each,
    plain PyTorch loop, 600 steps of 16 rows: teacher-forced item accuracy in calls 0.87 against 0.05).

    Args:
        model: a ``LlamaForCausalLM`` whose query/key/value/output projections are ``(H, H)`` (no grouping).
        generator: a ``torch.Generator`` (seeded by the caller) for the orthogonal matrices.
        vo, qk: the identity scales (defaults `MIMETIC_VO`, `MIMETIC_QK`; chosen once, not tuned: ``qk`` puts a
            token's attention logit on itself near 2.4 at unit-RMS inputs and head width 64).

    Raises:
        ValueError: a projection is not ``(H, H)``.
    """
    import torch

    with torch.no_grad():
        for layer in model.model.layers:
            attention = layer.self_attn
            projections = (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj)
            width = attention.q_proj.weight.shape[1]
            if any(p.weight.shape != (width, width) for p in projections):
                raise ValueError("mimetic_attention_init needs (H, H) attention projections (no grouped keys)")
            o1, _ = torch.linalg.qr(torch.randn(width, width, generator=generator))
            o2, _ = torch.linalg.qr(torch.randn(width, width, generator=generator))
            attention.v_proj.weight.copy_(o1.T * vo**0.5)
            attention.o_proj.weight.copy_(o1 * vo**0.5)
            attention.q_proj.weight.copy_(o2.T * qk**0.5)
            attention.k_proj.weight.copy_(o2.T * qk**0.5)


def lab_tiny_model(
    vocab_size: int, eos_token_id: int, sizes: LabTinySizes = LabTinySizes(), seed: int = 0
) -> PreTrainedModel:
    """A randomly initialised ``LlamaForCausalLM`` (float32, eval mode) with tied embeddings, drawn from
    ``torch.manual_seed(seed)`` inside ``torch.random.fork_rng`` (the caller's RNG is untouched), its attention
    initialised mimetically (`mimetic_attention_init`) unless ``sizes.mimetic_init`` is False.

    Raises:
        ValueError: `vocab_size` < 1 (the sizes validate themselves).
    """
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=sizes.hidden_size,
        num_hidden_layers=sizes.num_hidden_layers,
        num_attention_heads=sizes.num_attention_heads,
        num_key_value_heads=sizes.num_attention_heads,
        intermediate_size=sizes.intermediate_size,
        head_dim=sizes.hidden_size // sizes.num_attention_heads,
        max_position_embeddings=sizes.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        if sizes.mimetic_init:
            mimetic_attention_init(model, torch.Generator().manual_seed(seed))
    generation = model.generation_config
    generation.eos_token_id = generation.pad_token_id = eos_token_id
    generation.bos_token_id = None
    return model.eval()


def build_lab_tiny(
    sizes: LabTinySizes = LabTinySizes(), seed: int = 0
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """The untrained model and its tokenizer (`build_lab_tokenizer`, `lab_tiny_model`); save both with
    ``save_pretrained`` into one folder to get a model folder any command accepts."""
    tokenizer = build_lab_tokenizer()
    return lab_tiny_model(len(tokenizer), tokenizer.eos_token_id, sizes, seed), tokenizer


def lab_tiny_dir(cache_root: Path) -> Path:
    """The `lab-tiny` cache folder, ``<cache_root>/models/lab-tiny-<hash>`` (`agents.models.ensure_lab_tiny_model`
    builds it);
    the hash covers the template, the pattern, the default sizes, the default `LabConfig` (``to_dict``), the
    vocabulary itself (`lab_vocabulary`, about 3 s: so a change to the world's texts builds a new folder) and the
    version."""
    from benchmarks.lab import LabConfig

    recipe = json.dumps(
        [
            _VERSION,
            LAB_TINY_CHAT_TEMPLATE,
            lab_tiny_pattern(),
            dataclasses.asdict(LabTinySizes()),
            LabConfig().to_dict(),
            _vocabulary_once(),
        ]
    )
    digest = hashlib.sha256(recipe.encode()).hexdigest()[:10]
    return cache_root / "models" / f"{LAB_TINY_MODEL}-{digest}"
