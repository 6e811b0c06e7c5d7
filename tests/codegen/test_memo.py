"""codegen.memo.last_call: the last call's result for the very same arguments, never for equal
ones (a segment's bound is equal to another plan's and may differ in what it holds)."""

from fusecut.codegen.memo import last_call


def test_the_same_objects_are_answered_from_the_last_call_and_equal_ones_are_not():
    calls = []

    @last_call
    def size(xs: list) -> int:
        calls.append(list(xs))
        return len(xs)

    a, b = [1, 2], [1, 2]
    assert size(a) == 2 and size(a) == 2
    assert len(calls) == 1
    assert size(b) == 2  # equal, not the same: computed again
    assert len(calls) == 2
    assert size(b) == 2 and len(calls) == 2  # b was the last: answered from it
    assert size(a) == 2 and len(calls) == 3  # a is no longer the last: computed again
