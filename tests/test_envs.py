"""Environments and token-exact multi-turn trajectories: the parts that need no engine."""

import pytest

from rlvr.config import DataConfig, EnvConfig, SandboxConfig
from rlvr.envs import EnvContext, make_env
from rlvr.envs.builtin import tool_call
from rlvr.models.tiny import build_char_tokenizer
from rlvr.records import Problem
from rlvr.rollout.prompts import Renderer

PROBLEM = Problem(id="p", question="What is 347*56?", answer="19432")

# Qwen3's way with history: earlier assistant turns lose their <think>...</think> block.
STRIPPING_TEMPLATE = (
    "{% for message in messages %}"
    "{% set content = message['content'] %}"
    "{% if message['role'] == 'assistant' and not loop.last %}{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + content + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def context(**env) -> EnvContext:
    return EnvContext(EnvConfig(**env), SandboxConfig())


def test_tool_calls_in_tags_or_hermes_json():
    assert tool_call("let me see <calc>347*56</calc>", "calc") == "347*56"
    assert (
        tool_call('<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>', "python")
        == "print(1)"
    )
    assert tool_call('<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>', "python") is None
    assert tool_call("<calc>1+2", "calc") == "1+2"  # cut off by the stop string: the block is still the call
    assert tool_call("the answer is \\boxed{3}", "calc") is None


def test_calculator_answers_arithmetic_and_refuses_anything_else():
    env = make_env("calculator", PROBLEM, context())
    assert env.reset(PROBLEM) is None  # the row's own prompt
    step = env.step("<calc>347*56</calc>")
    assert (step.done, step.tool_calls, step.tool_errors) == (False, 1, 0)
    assert step.observation == [{"role": "user", "content": "19432"}]
    for hostile in ("__import__('os').system('id')", "9**9**9**9", "(lambda: 1)()", "[1] * 10**9"):
        refused = env.step(f"<calc>{hostile}</calc>")
        assert refused.tool_errors == 1 and refused.observation[0]["content"].startswith("error:")
    final = env.step("\\boxed{19432}")
    assert final.done and final.reward is None  # the verifier scores the answer


def test_a_row_names_its_own_environment():
    row = Problem(id="q", question="1+1", answer="2", meta={"env": "calculator"})
    assert type(make_env("single_turn", row, context())).__name__ == "Calculator"
    with pytest.raises(ValueError, match="env.name='nope' \\(problem 'p'\\): unknown environment"):
        make_env("nope", PROBLEM, context())


@pytest.mark.parametrize("template", ["chatml", "stripping"])
def test_observations_are_rendered_alone_and_sampled_tokens_never_change(template):
    """A trajectory built turn by turn keeps every sampled token where it was sampled; rendering
    the whole conversation again (what a re-tokenizing loop does) would not, with a template that
    strips reasoning from earlier turns."""
    tokenizer = build_char_tokenizer()
    if template == "stripping":
        tokenizer.chat_template = STRIPPING_TEMPLATE
    renderer = Renderer(tokenizer, DataConfig(train="-"))
    messages = [{"role": "user", "content": PROBLEM.question}]
    ids = renderer.prompt(PROBLEM, messages)
    mask = [0] * len(ids)
    turns = ["<think>big product</think><calc>347*56</calc>", "<think>so</think>\\boxed{19432}"]
    for k, text in enumerate(turns):
        sampled = tokenizer(text, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        ids += sampled
        mask += [1] * len(sampled)
        messages.append({"role": "assistant", "content": text})
        if k == 0:
            observation = renderer.observation([{"role": "user", "content": "19432"}], ended_turn=True)
            ids += observation
            mask += [0] * len(observation)
            messages.append({"role": "user", "content": "19432"})
    sampled_positions = [i for i, m in enumerate(mask) if m]
    assert tokenizer.decode([ids[i] for i in sampled_positions]) == "".join(t + "<|im_end|>" for t in turns)
    # the trajectory is what the chat template gives the conversation, turn by turn ...
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    built = tokenizer.decode(ids) + "\n"  # the template closes the last turn with a newline
    if template == "chatml":
        assert built == rendered
    else:  # ... but not what it gives the whole conversation at once: history was rewritten
        assert (
            built != rendered and "<think>big product</think>" not in rendered and "<think>big product</think>" in built
        )


def test_a_turn_stopped_by_a_stop_string_gets_its_end_of_turn_appended():
    tokenizer = build_char_tokenizer()
    renderer = Renderer(tokenizer, DataConfig(train="-"))
    ended = tokenizer.decode(renderer.observation([{"role": "user", "content": "7"}], ended_turn=True))
    stopped = tokenizer.decode(renderer.observation([{"role": "user", "content": "7"}], ended_turn=False))
    assert ended == "\n<|im_start|>user\n7<|im_end|>\n<|im_start|>assistant\n"
    assert stopped == "<|im_end|>" + ended


def test_without_a_chat_template_observations_are_plain_lines():
    tokenizer = build_char_tokenizer()
    renderer = Renderer(tokenizer, DataConfig(train="-", chat_template=False))
    assert tokenizer.decode(renderer.observation([{"role": "user", "content": "7"}], ended_turn=True)) == "\n7\n"
