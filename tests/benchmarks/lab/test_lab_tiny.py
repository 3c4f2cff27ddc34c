"""`lab-tiny` (`benchmarks.lab.lab_tiny`): the phrase-level tokenizer made from the lab world, the chat template, the
Llama built from a config, its cache folder, and that it learns from the world's demonstrations."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.lab import LabSuite
from benchmarks.lab.lab_tiny import (
    LAB_TINY_MODEL,
    LabTinySizes,
    build_lab_tokenizer,
    lab_tiny_dir,
    lab_tiny_model,
    lab_vocabulary,
)
from benchmarks.lab.tasks import ITEMS
from envace_gym.parsing import format_tool_calls, parse_tool_calls
from envace_gym.rendering import ChatRenderer


@pytest.fixture(scope="module")
def tokenizer():
    return build_lab_tokenizer()


@pytest.fixture(scope="module")
def suite():
    return LabSuite()


def test_every_test_task_text_round_trips_with_no_unknown_piece(tokenizer, suite):
    """The vocabulary is made from train-stream texts only, yet covers every test prompt and reference call, and
    the output of every tool on every shelf and item of the test states, before and after the reference."""
    from envace_gym.types import ToolCall

    renderer = ChatRenderer(tokenizer)
    for task in suite.tasks(None, "test")[::7]:
        backend = suite.make_backend(task)
        texts = [renderer.render(task.turns[0], task.tools, add_generation_prompt=True)]
        shelves = list(task.metadata["initial_state"]["shelves"])
        looks = [ToolCall("list_shelf", {"shelf": s}) for s in shelves]
        looks += [ToolCall("locate", {"item": i}) for i in ITEMS] + [ToolCall("inventory", {})]
        texts += [backend.execute(c) for c in looks]
        for call in (c for turn in suite.ground_truth(task) for c in turn):
            texts += [format_tool_calls([call], "hermes"), backend.execute(call)]
        texts += [backend.execute(c) for c in looks]
        for text in texts:
            ids = tokenizer.encode(text, add_special_tokens=False)
            assert tokenizer.unk_token_id not in ids, text
            assert tokenizer.decode(ids) == text


def test_an_item_is_one_token_wherever_it_appears(tokenizer):
    for item in ITEMS:
        prose = tokenizer.encode(f"Move the {item} to", add_special_tokens=False)
        call = tokenizer.encode(
            format_tool_calls(
                [__import__("envace_gym.types", fromlist=["ToolCall"]).ToolCall("pack", {"item": item})], "hermes"
            ),
            add_special_tokens=False,
        )
        (item_id,) = tokenizer.encode(item, add_special_tokens=False)
        assert item_id in prose and item_id in call


def test_a_space_is_a_token_only_between_two_entities(tokenizer, suite):
    """Spaces ride on the words and punctuation next to them, so prose is not twice as long and the token before
    an item is a word; a bare space piece appears only where two entities meet (``apple A``)."""
    import string

    from benchmarks.lab.world import DOCKS

    entities = {*ITEMS, *DOCKS, *string.ascii_uppercase, *string.digits}
    renderer = ChatRenderer(tokenizer)
    for task in suite.tasks(None, "test")[::50]:
        backend = suite.make_backend(task)
        texts = [renderer.render(task.turns[0], task.tools, add_generation_prompt=True)]
        for call in (c for turn in suite.ground_truth(task) for c in turn):
            texts += [format_tool_calls([call], "hermes"), backend.execute(call)]
        for text in texts:
            pieces = tokenizer.convert_ids_to_tokens(tokenizer.encode(text, add_special_tokens=False))
            for before, piece, after in zip(pieces, pieces[1:], pieces[2:]):
                if piece == " ":
                    assert before in entities and after in entities, (before, after, text)
        words = tokenizer.convert_ids_to_tokens(tokenizer.encode(texts[0], add_special_tokens=False))
        assert {"Ship the ", "Move the "} & set(words)  # the text between two entities is one phrase


def test_the_token_before_an_item_names_its_part_in_the_instruction(tokenizer):
    pieces = tokenizer.convert_ids_to_tokens(
        tokenizer.encode(
            "Move the lamp to the shelf where the drill is. If that shelf is full, put the lamp on shelf B.",
            add_special_tokens=False,
        )
    )
    assert pieces == [
        "Move the ",
        "lamp",
        " to the shelf where the ",
        "drill",
        " is. If that shelf is full, put the ",
        "lamp",
        " on shelf ",
        "B",
        ".",
    ]


def test_text_no_phrase_covers_falls_back_to_known_words(tokenizer):
    text = "Move the shelf where the lamp is, then ship the jar."  # the world's words in an order it never writes
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.unk_token_id not in ids and tokenizer.decode(ids) == text
    assert "then " in tokenizer.convert_ids_to_tokens(ids)


def test_tool_call_tags_survive_skipping_special_tokens_and_parse(tokenizer):
    from envace_gym.types import ToolCall

    text = format_tool_calls([ToolCall("ship", {"box": "B2-1", "dock": "north"})], "hermes")
    ids = tokenizer.encode(text + "<|end|>", add_special_tokens=False)
    assert ids[-1] == tokenizer.eos_token_id
    decoded = tokenizer.decode(ids, skip_special_tokens=True)
    assert decoded == text and parse_tool_calls(decoded)[0].arguments == {"box": "B2-1", "dock": "north"}


def test_the_template_renders_tools_as_names_and_no_hermes_prompt(tokenizer, suite):
    renderer = ChatRenderer(tokenizer)
    assert renderer.tools_supported
    task = suite.tasks(["ship"], "test")[0]
    text = renderer.render(task.turns[0], task.tools, add_generation_prompt=True)
    assert "Tools: locate list_shelf move pack ship<|end|>" in text and "<tools>" not in text
    assert text.endswith("<|assistant|>") and text.startswith("<|system|>")
    assert len(tokenizer.encode(text, add_special_tokens=False)) < 150


def test_saved_and_reloaded_like_any_transformers_tokenizer(tokenizer, tmp_path):
    from transformers import AutoTokenizer

    tokenizer.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    text = 'Shelf A: apple, bolt.\n<tool_call>\n{"name": "pack", "arguments": {"item": "apple"}}\n</tool_call>'
    assert again.encode(text, add_special_tokens=False) == tokenizer.encode(text, add_special_tokens=False)
    assert again.chat_template == tokenizer.chat_template and again.eos_token == "<|end|>"


def test_the_vocabulary_is_deterministic_and_closed_early():
    assert lab_vocabulary(10) == lab_vocabulary(50)  # a small sample of the world already holds every piece


def test_model_from_config_is_seeded_and_sized(tokenizer):
    a = lab_tiny_model(len(tokenizer), tokenizer.eos_token_id, seed=0)
    b = lab_tiny_model(len(tokenizer), tokenizer.eos_token_id, seed=0)
    c = lab_tiny_model(len(tokenizer), tokenizer.eos_token_id, seed=1)
    assert torch.equal(a.model.embed_tokens.weight, b.model.embed_tokens.weight)
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)
    n = sum(p.numel() for p in a.parameters())
    assert 0.5e6 < n < 1.5e6 and a.config.tie_word_embeddings and a.config.eos_token_id == tokenizer.eos_token_id
    with pytest.raises(ValueError, match="divisible"):
        LabTinySizes(hidden_size=130, num_attention_heads=4)


def test_the_named_model_is_built_once_into_the_cache(tmp_path):
    from agents.models import ModelStore

    store = ModelStore(tmp_path)
    model, tok = store.model(LAB_TINY_MODEL), store.tokenizer(LAB_TINY_MODEL)
    folder = lab_tiny_dir(tmp_path)
    assert (folder / "model.safetensors").is_file()
    assert json.loads((folder / "config.json").read_text())["vocab_size"] == len(tok)
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    ModelStore(tmp_path).model(LAB_TINY_MODEL)
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp  # loaded, not rebuilt
    assert model.config.vocab_size == len(tok)


def test_sft_on_a_few_demonstrations_learns_them(tokenizer):
    """The model, the template and the demonstrations fit together: 40 steps on 8 demonstrations cut the ACT
    and REHEARSE loss by more than half."""
    from agents.rollout import Role
    from agents.training.demonstrations import build_demonstrations
    from agents.training.logprobs import token_logprobs
    from agents.training.sft import collate, role_weights, sft_loss

    demos, _ = build_demonstrations(tokenizer, "lab", None, "train", max_tokens=None, limit=8)
    model = lab_tiny_model(len(tokenizer), tokenizer.eos_token_id, seed=0).train()
    ids, mask, roles = collate(demos, tokenizer.pad_token_id)
    weights = {Role.ACT: 1.0, Role.REHEARSE: 1.0}
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(40):
        loss, stats = sft_loss(token_logprobs(model, ids, mask), roles, weights)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(stats["loss"])
    assert role_weights(roles, weights).sum() > 0
    assert losses[-1] < 0.5 * losses[0], losses


def test_a_value_follows_the_same_key_token_in_a_call_and_in_its_output(tokenizer, suite):
    """An output repeats a call's value after the same token (``item": "``), so one token of context finds it."""
    from envace_gym.types import ToolCall

    task = suite.tasks(["ship"], "test")[0]
    backend = suite.make_backend(task)
    item = task.metadata["initial_state"]["shelves"]
    item = next(i for shelf in item.values() for i in shelf)
    call = format_tool_calls([ToolCall("pack", {"item": item})], "hermes")
    pieces = [
        tokenizer.convert_ids_to_tokens(tokenizer.encode(t, add_special_tokens=False))
        for t in (call, backend.execute(ToolCall("pack", {"item": item})))
    ]
    for seq in pieces:
        assert seq[seq.index(item) - 1] == 'item": "', seq


def test_mimetic_init_starts_every_attention_layer_as_a_copy(tokenizer):
    from benchmarks.lab.lab_tiny import MIMETIC_QK, MIMETIC_VO

    model = lab_tiny_model(len(tokenizer), tokenizer.eos_token_id, seed=3)
    eye = torch.eye(model.config.hidden_size)
    for layer in model.model.layers:
        a = layer.self_attn
        torch.testing.assert_close(a.o_proj.weight @ a.v_proj.weight, MIMETIC_VO * eye, atol=1e-5, rtol=0)
        torch.testing.assert_close(a.q_proj.weight.T @ a.k_proj.weight, MIMETIC_QK * eye, atol=1e-5, rtol=0)
    plain = lab_tiny_model(len(tokenizer), tokenizer.eos_token_id, LabTinySizes(mimetic_init=False), seed=3)
    a = plain.model.layers[0].self_attn
    assert not torch.allclose(a.o_proj.weight @ a.v_proj.weight, MIMETIC_VO * eye, atol=0.1)
    torch.testing.assert_close(plain.model.embed_tokens.weight, model.model.embed_tokens.weight)  # same draw otherwise
