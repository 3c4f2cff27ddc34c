"""`lab-tiny`: a Llama built from a config, with a word-level tokenizer made offline from the lab world's
vocabulary, to be trained from scratch on the hidden-rules lab world (`benchmarks.lab.hidden`) in minutes.

Why word-level. Every item, shelf letter, digit, tool and keyword is one token, so copying an item name from
the instruction into a call is copying one token, not a sequence of byte-level BPE pieces (small Llamas with
BPE tokenizers and ~250-token prompts never learned that copy here; a word-level probe learned unstated
rules in minutes). A hidden-rules test prompt is 46 to 87 tokens (`lab_tiny_pattern`).

The tokenizer (`build_lab_tokenizer`) is a `tokenizers` ``WordLevel`` model whose pre-tokenizer
(`lab_tiny_pattern`) splits text so that no space is a token of its own where it can be avoided: the world's
entities (items, docks, single capital letters: what a call copies from the prompt or an output) are pieces
that never carry a space, so an item is the same token in prose (``Ship the hammer``) and in a call's JSON
(``"item": "hammer"``); every other word and punctuation run carries the spaces next to it (``Ship ``, ``the ``,
`` from ``, ``, ``). Digits are single pieces; a space between two entities or digits stays a piece of its
own. Why: with every space a token, a prompt is about 1.5 times as long (mean 97 tokens against 66) and the
token before an item is a space (a worse cue for the previous-token head a copy needs); in a throwaway plain
loop on ship demonstrations (lr 2e-3) with the space tokens dropped the copy appeared at about step 175,
with them not by step 250. Its decoder joins pieces with nothing between them (``Fuse``), so ``decode(encode(t)) == t`` for any text made of known pieces. The vocabulary is every
piece of the texts the world can show or be answered with (`lab_vocabulary`: the chat template's words, the
train stream's prompts, calls, closing messages, outputs and the error outputs of common mistakes), plus
every item name, letter and digit; a piece outside it is ``[UNK]``. Special tokens: one per role
(``<|system|>``, ``<|user|>``, ``<|assistant|>``, ``<|tool|>``), ``<|end|>`` (end of a message: EOS and
padding), ``[UNK]``; the fixed parts of a Hermes call (`_ADDED`) are added tokens that are not special (they
must survive ``skip_special_tokens``).

The chat template (`LAB_TINY_CHAT_TEMPLATE`) writes ``<|role|>content<|end|>`` per message and the tools as one
line of names in the first system message (``Tools: locate list_shelf move pack ship``); it renders
``tools`` (so `envace_gym.rendering` never adds the long Hermes tool prompt).

The model (`lab_tiny_model`) is a ``LlamaForCausalLM`` with tied embeddings, initialised from ``seed`` in a
forked RNG. The named model ``lab-tiny`` (`ensure_lab_tiny_model`) is the default sizes with seed 0, built once
into ``<cache>/models/lab-tiny-<hash>/`` like the other cached models (`agents.models`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

__all__ = ["LAB_TINY_MODEL", "lab_tiny_pattern", "LAB_TINY_CHAT_TEMPLATE", "LabTinySizes", "lab_vocabulary",
           "build_lab_tokenizer", "lab_tiny_model", "lab_tiny_dir", "ensure_lab_tiny_model", "build_lab_tiny"]

logger = logging.getLogger(__name__)

LAB_TINY_MODEL = "lab-tiny"


@functools.lru_cache(maxsize=1)
def lab_tiny_pattern() -> str:
    """The pre-tokenizer's regular expression (Oniguruma, as `tokenizers` compiles it), first match wins:

    1. an entity (`benchmarks.lab.tasks.ITEMS`, `benchmarks.lab.world.DOCKS`, or one capital letter) not
       inside a longer word, without spaces;
    2. one digit;
    3. any other run of letters and underscores (``list_shelf`` is one piece), with at most one space on
       each side;
    4. a run of punctuation, with at most one space on each side;
    5. a run of whitespace (what is left: a newline, a space between two entities or digits).
    """
    from benchmarks.lab.tasks import ITEMS
    from benchmarks.lab.world import DOCKS

    names = "|".join(sorted({*ITEMS, *DOCKS}, key=lambda n: (-len(n), n)))
    entity = rf"(?<![A-Za-z_])(?:{names}|[A-Z])(?![A-Za-z_])"
    return rf"{entity}|\d| ?(?!{entity})[A-Za-z_]+ ?| ?[^\w\s]+ ?|\s+"


_SPECIAL = ["[UNK]", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]
_ADDED = ['<tool_call>\n{"name": "', '", "arguments": {"', '"}}\n</tool_call>', '": "', '", "', "<tool_call>",
          "</tool_call>"]
"""Added tokens (matched in raw text before the pre-tokenizer, longest first): the fixed parts of a Hermes
call and of JSON's ``": "`` / ``", "``, so a call is about 8 tokens (``<open> pack <args> item <: > mirror
<close>``) instead of 26 and an item is still one token."""
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
_VERSION = "v5"  # bump when the build changes in a way the folder hash does not see


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
            with two it began copying docks and items (one initialisation each; `benchmarks.lab.tiny_sft`).
        intermediate_size: MLP width.
        max_position_embeddings: longest sequence in tokens (RoPE needs no table, this only bounds use).
    """

    hidden_size: int = 128
    num_hidden_layers: int = 4
    num_attention_heads: int = 2
    intermediate_size: int = 384
    max_position_embeddings: int = 1024

    def __post_init__(self) -> None:
        if min(dataclasses.astuple(self)) < 1 or self.hidden_size % self.num_attention_heads:
            raise ValueError(f"LabTinySizes: sizes must be >= 1 and hidden_size divisible by num_attention_heads, "
                             f"got {self}")


def _pieces(texts: Iterable[str]) -> set[str]:
    import tokenizers

    split = tokenizers.pre_tokenizers.Split(tokenizers.Regex(lab_tiny_pattern()), behavior="isolated")
    return {piece for text in texts for piece, _ in split.pre_tokenize_str(text)}


def _world_texts(train_tasks: int) -> Iterable[str]:
    """Every text the lab world shows over `train_tasks` tasks of each hidden-rules family from the train stream
    (prompts, reference calls, their real outputs, closing messages), the error outputs of common mistakes,
    and every item, letter and digit."""
    import string

    from agents.demonstrations import DONE_MESSAGE, NO_CALL_MESSAGE
    from benchmarks.lab import LabSuite
    from benchmarks.lab.tasks import ITEMS
    from benchmarks.lab.world import DISTRACTOR_TOOLS, DOCKS, HIDDEN_TOOLS
    from envace_gym.parsing import format_tool_calls
    from envace_gym.types import ToolCall

    suite = LabSuite()
    yield from (DONE_MESSAGE, NO_CALL_MESSAGE, *ITEMS, *DOCKS, *string.ascii_uppercase, *string.digits,
                *HIDDEN_TOOLS, *DISTRACTOR_TOOLS)
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
        mistakes = [ToolCall("move", {"item": "apple", "shelf": "A"}), ToolCall("pack", {"item": "unicorn"}),
                    ToolCall("ship", {"box": "A9-9", "dock": "north"}), ToolCall("list_shelf", {"shelf": "Z"}),
                    ToolCall("locate", {"item": "unicorn"}), ToolCall("ship", {"box": "A1-1", "dock": "moon"}),
                    ToolCall("move", {"item": "unicorn", "shelf": "A"}), ToolCall("move", {})]
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
    """The word-level vocabulary (module docstring): special tokens first, then the pieces sorted.

    Args:
        train_tasks: train-stream tasks per family whose texts are split (no test task is read).
    """
    pieces = sorted(_pieces(_world_texts(train_tasks)))
    return _SPECIAL + _ADDED + [p for p in pieces if p not in _SPECIAL and p not in _ADDED]


@functools.lru_cache(maxsize=1)
def _vocabulary_once() -> tuple[str, ...]:
    return tuple(lab_vocabulary())


def build_lab_tokenizer(vocabulary: list[str] | None = None) -> PreTrainedTokenizerFast:
    """The word-level tokenizer over `vocabulary` (None: `lab_vocabulary()`), with `LAB_TINY_CHAT_TEMPLATE`.

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
    out = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>", pad_token="<|end|>", unk_token="[UNK]",
                                  clean_up_tokenization_spaces=False)
    out.chat_template = LAB_TINY_CHAT_TEMPLATE
    return out


def lab_tiny_model(vocab_size: int, eos_token_id: int, sizes: LabTinySizes = LabTinySizes(), seed: int = 0
                   ) -> PreTrainedModel:
    """A randomly initialised ``LlamaForCausalLM`` (float32, eval mode) with tied embeddings, drawn from
    ``torch.manual_seed(seed)`` inside ``torch.random.fork_rng`` (the caller's RNG is untouched).

    Raises:
        ValueError: `vocab_size` < 1 (the sizes validate themselves).
    """
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=sizes.hidden_size, num_hidden_layers=sizes.num_hidden_layers,
                         num_attention_heads=sizes.num_attention_heads, num_key_value_heads=sizes.num_attention_heads,
                         intermediate_size=sizes.intermediate_size,
                         head_dim=sizes.hidden_size // sizes.num_attention_heads,
                         max_position_embeddings=sizes.max_position_embeddings, tie_word_embeddings=True,
                         bos_token_id=None, eos_token_id=eos_token_id, pad_token_id=eos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    generation = model.generation_config
    generation.eos_token_id = generation.pad_token_id = eos_token_id
    generation.bos_token_id = None
    return model.eval()


def build_lab_tiny(sizes: LabTinySizes = LabTinySizes(), seed: int = 0
                   ) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """The untrained model and its tokenizer (`build_lab_tokenizer`, `lab_tiny_model`); save both with
    ``save_pretrained`` into one folder to get a model folder any command accepts."""
    tokenizer = build_lab_tokenizer()
    return lab_tiny_model(len(tokenizer), tokenizer.eos_token_id, sizes, seed), tokenizer


def lab_tiny_dir(cache_root: Path | None = None) -> Path:
    """The `lab-tiny` cache folder, ``<cache_root>/models/lab-tiny-<hash>`` (None: `agents.models.cache_dir()`);
    the hash covers the template, the pattern, the default sizes, the default `LabConfig`, the vocabulary itself
    (`lab_vocabulary`, about 3 s: so a change to the world's texts builds a new folder) and the version."""
    from agents.models import cache_dir
    from benchmarks.lab import LabConfig

    recipe = json.dumps([_VERSION, LAB_TINY_CHAT_TEMPLATE, lab_tiny_pattern(), dataclasses.asdict(LabTinySizes()),
                         dataclasses.asdict(LabConfig()), _vocabulary_once()])
    digest = hashlib.sha256(recipe.encode()).hexdigest()[:10]
    return (cache_root or cache_dir()) / "models" / f"{LAB_TINY_MODEL}-{digest}"


def ensure_lab_tiny_model(cache_root: Path | None = None) -> Path:
    """Build the `lab-tiny` folder once (default sizes, seed 0; about 10 s) and return it."""
    from agents.models import _build_once

    target = lab_tiny_dir(cache_root)

    def build() -> tuple[Any, Any]:
        logger.info("building %s into %s (once)", LAB_TINY_MODEL, target)
        return build_lab_tiny()

    return _build_once(target, LAB_TINY_MODEL, build)
