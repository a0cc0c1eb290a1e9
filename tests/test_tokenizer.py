"""A Mistral folder's tokenizer (`tekken.json` only) gives the ids vLLM's `tokenizer_mode="mistral"`
gives: prompts, chats with a system message, and a multi-turn observation rendered alone."""

import shutil
from pathlib import Path

import mistral_common
import pytest

from rlvr.config import DataConfig
from rlvr.models.tiny import build_char_tokenizer
from rlvr.models.tokenizer import load_tokenizer, uses_mistral_tokenizer
from rlvr.records import Problem
from rlvr.rollout.prompts import Renderer, encode_prompt

# a tekken file mistral-common ships (version 7: [INST] ... [/INST], a system prompt joins the last user turn)
SHIPPED_TEKKEN = Path(mistral_common.__file__).parent / "data" / "tekken_240911.json"
PROBLEM = Problem("1", "What is $\\frac{1}{2}+{x}$?", "1")


@pytest.fixture(scope="module")
def tekken_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tekken")
    shutil.copy(SHIPPED_TEKKEN, folder / "tekken.json")
    return folder


@pytest.fixture(scope="module")
def vllm_tokenizer(tekken_folder):
    from vllm.tokenizers.registry import get_tokenizer

    return get_tokenizer(str(tekken_folder), tokenizer_mode="mistral")


@pytest.fixture(scope="module")
def tokenizer(tekken_folder):
    return load_tokenizer(tekken_folder)


def test_which_folders_take_mistral_common(tmp_path, tekken_folder):
    assert uses_mistral_tokenizer(tekken_folder)
    build_char_tokenizer().save_pretrained(tmp_path)
    assert not uses_mistral_tokenizer(tmp_path)
    (tmp_path / "tekken.json").symlink_to(SHIPPED_TEKKEN)
    assert not uses_mistral_tokenizer(tmp_path)  # a Hugging Face folder with both: its own tokenizer.json
    (tmp_path / "consolidated.safetensors").touch()
    assert uses_mistral_tokenizer(tmp_path)  # Mistral's layout: tekken.json, as vLLM decides


@pytest.mark.parametrize("system_prompt", [None, "Be brief."])
def test_prompts_are_the_ids_vllm_renders(tokenizer, vllm_tokenizer, system_prompt):
    from rlvr.data.templates import chat_messages

    data = DataConfig(train="gsm8k", template="boxed", system_prompt=system_prompt)
    messages = chat_messages(PROBLEM, data.template, data.system_prompt)
    expected = vllm_tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert encode_prompt(PROBLEM, tokenizer, data) == expected
    assert Renderer(tokenizer, data).prompt(PROBLEM, messages) == expected
    assert expected[0] == vllm_tokenizer.bos_token_id and expected[-1] == vllm_tokenizer.convert_tokens_to_ids(
        "[/INST]"
    )
    # without the chat template: the text's own tokens, as vLLM encodes a prompt without special tokens
    plain = DataConfig(train="gsm8k", template="boxed", system_prompt=system_prompt, chat_template=False)
    text = "\n\n".join(m["content"] for m in messages)
    assert encode_prompt(PROBLEM, tokenizer, plain) == vllm_tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("ended_turn", [True, False])
def test_a_turn_then_an_observation_is_the_whole_chat_vllm_renders(tokenizer, vllm_tokenizer, ended_turn):
    data = DataConfig(train="gsm8k")
    renderer = Renderer(tokenizer, data)
    first = [{"role": "user", "content": "Compute 6*7 with the tool."}]
    reply, observation = "call: 6*7", [{"role": "user", "content": "tool says 42"}]
    sampled = vllm_tokenizer.encode(reply, add_special_tokens=False) + (
        [vllm_tokenizer.eos_token_id] if ended_turn else []
    )
    ids = renderer.prompt(PROBLEM, first) + sampled + renderer.observation(observation, ended_turn=ended_turn)
    whole = first + [{"role": "assistant", "content": reply}] + observation
    assert ids == vllm_tokenizer.apply_chat_template(whole, add_generation_prompt=True)
