"""A sample an update aborted, continued and stitched back together, without vLLM: the continuation's
request, and the sample rebuilt from both pieces (tests/test_inflight_abort.py runs it through vLLM)."""

from rlvr.engines.inflight import NOTHING_YET, Flight, continuation, continuation_seed, stitched
from rlvr.records import Request, Rollout, Sampling

TEXT = {1: "a", 2: "b", 3: "X", 4: "Y", 5: "c"}


def decode(ids: list[int]) -> str:
    return "".join(TEXT[i] for i in ids)


def test_a_continuation_goes_on_from_what_was_seen():
    submitted = Request("k", [9, 9], 4, Sampling(max_tokens=10, seed=100))
    seen = NOTHING_YET.extended([1, 2, 3], [-0.1, -0.2, -0.3], version=0, text="")
    again = continuation(Flight(submitted, ignore_eos=False), submitted, "rlvr-0", 2, seen, version=1)
    assert again.request.prompt == [9, 9, 1, 2, 3] and again.request.n == 1
    assert again.request.sampling.max_tokens == 7
    assert again.request.sampling.seed == continuation_seed(102, 1) != continuation_seed(102, 2)  # sample 2: seed + 2
    assert (again.origin, again.index, again.prefix) == ("rlvr-0", 2, seen)
    # a continuation of a continuation keeps its own seed, moved on by the next version
    twice = continuation(again, submitted, "rlvr-0", 2, seen.extended([5], [-0.5], 1, ""), version=2)
    assert twice.request.sampling.seed == continuation_seed(again.request.sampling.seed, 2)
    assert twice.request.sampling.max_tokens == 6 and twice.prefix.versions == [0, 0, 0, 1]


def test_a_stitched_sample_is_both_pieces_in_order():
    submitted = Request("k", [9], 1, Sampling(max_tokens=10))
    prefix = NOTHING_YET.extended([1, 2], [-0.1, -0.2], 0, "")
    rest = Rollout(0, [9, 1, 2], [3, 5], [-0.3, -0.5], "length", "Xc", versions=[1, 1])
    whole = stitched(submitted, prefix, rest, decode)
    assert (whole.prompt_ids, whole.completion_ids, whole.versions) == ([9], [1, 2, 3, 5], [0, 0, 1, 1])
    assert (whole.logprobs, whole.text, whole.finish_reason) == ([-0.1, -0.2, -0.3, -0.5], "abXc", "length")


def test_a_stop_string_across_the_seam_ends_the_sample_there():
    submitted = Request("k", [9], 1, Sampling(max_tokens=10, stop=("XY",)))
    prefix = NOTHING_YET.extended([1, 3], [-0.1, -0.3], 0, "aX")  # "X" before the update, "Y" after
    rest = Rollout(0, [9, 1, 3], [4, 5, 1], [-0.4, -0.5, -0.1], "length", "Yca", versions=[1, 1, 1])
    whole = stitched(submitted, prefix, rest, decode)
    assert (whole.completion_ids, whole.text, whole.finish_reason) == ([1, 3, 4], "aXY", "stop")
    assert whole.versions == [0, 0, 1] and whole.logprobs == [-0.1, -0.3, -0.4]
