"""Data-quality expectations, pure (issue 60): the declarations and their checks, and the verdict
on a txid from what was measured, against plain Python applying the same rules: a txid stops iff
a ``fail`` expectation failed, the rows it quarantines are exactly those its ``drop`` expectations
fail, ``warn`` never changes what commits, and the sigma bound is the sample standard deviation's,
decided exactly."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from collections import Counter
from fractions import Fraction

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from airflow_txn_provider.rules.exceptions import InvalidNameError, TxnConfigError
from airflow_txn_provider.rules.expectations import (
    FAILING_ROWS,
    INPUT,
    SAMPLE_KEYS,
    Action,
    Check,
    Expectation,
    FailingShare,
    Measured,
    RowCondition,
    RowCount,
    RowCountWithinSigma,
    Taken,
    Verdict,
    check_declared,
    judge_expectations,
    poison_note,
)


def a_check(data):
    return bool(data), "data is there"


def judge_one(exp: Expectation, measured: Measured, history=None) -> Verdict:
    counts = {exp.name: history} if history is not None else None
    return judge_expectations([exp], [measured], counts)


def outcome_of(exp: Expectation, measured: Measured, history=None):
    (outcome,) = judge_one(exp, measured, history).outcomes
    return outcome


# -- declarations ------------------------------------------------------------------------------


def test_each_kind_derives_a_stable_name_from_its_declaration_alone():
    declared = [
        (RowCondition("amount >= 0"), "input: amount >= 0"),
        (RowCondition("amount  >=\n 0", on="orders"), "orders: amount >= 0"),
        (RowCount(min=1), "input: rows >= 1"),
        (RowCount(max=9, on="orders"), "orders: rows <= 9"),
        (RowCount(min=1, max=9), "input: rows in [1, 9]"),
        (RowCountWithinSigma(), "input: rows within 3.0 sigma of the last 20"),
        (RowCountWithinSigma(k=2, last=7), "input: rows within 2 sigma of the last 7"),
        (FailingShare("sku IS NOT NULL"), "input: share failing sku IS NOT NULL <= 0.01"),
        (Check(a_check, on="words"), "words: a_check"),
    ]
    for exp, name in declared:
        assert exp.name == name
        assert dataclasses.replace(exp).name == name  # declared again: the same name
    assert RowCondition("x > 0", name="positive x").name == "positive x"
    assert len(RowCondition("x = '" + "y" * 300 + "'").name) == 200


def test_a_declaration_is_a_frozen_value_whose_action_may_be_its_string():
    exp = RowCondition("amount >= 0", action="drop", on="orders")
    assert exp.action is Action.DROP and exp.on == "orders"
    assert RowCount(min=1).action is Action.WARN  # the default, as Delta Live Tables' expect
    assert RowCount(min=1, action=Action.FAIL) == RowCount(min=1, action="fail")
    with pytest.raises(dataclasses.FrozenInstanceError):
        exp.action = Action.WARN  # type: ignore[misc]


def _lambda_check():
    return Check(lambda rows: (True, ""))


BAD_DECLARATIONS = {
    "empty SQL": (lambda: RowCondition(""), "needs one SQL expression"),
    "blank SQL": (lambda: RowCondition("  \n "), "needs one SQL expression"),
    "SQL not a string": (lambda: RowCondition(None), "needs one SQL expression"),
    "two statements": (lambda: RowCondition("a > 0; DROP TABLE t"), "no ';'"),
    "NUL in SQL": (lambda: FailingShare("a > 0\x00"), "no ';' or NUL"),
    "empty share SQL": (lambda: FailingShare(" "), "FailingShare needs"),
    "no bound": (lambda: RowCount(), "RowCount min= or max="),
    "negative min": (lambda: RowCount(min=-1), "RowCount min must be >= 0"),
    "negative max": (lambda: RowCount(max=-1), "RowCount max must be >= 0"),
    "min above max": (lambda: RowCount(min=5, max=3), "RowCount max must be >= 5"),
    "bool bound": (lambda: RowCount(min=True), "RowCount min must be a finite int"),
    "float bound": (lambda: RowCount(max=1.5), "RowCount max must be a finite int"),
    "k zero": (lambda: RowCountWithinSigma(k=0), "k must be > 0"),
    "k negative": (lambda: RowCountWithinSigma(k=-1.0), "k must be > 0"),
    "k nan": (lambda: RowCountWithinSigma(k=math.nan), "k must be a finite number"),
    "k infinite": (lambda: RowCountWithinSigma(k=math.inf), "k must be a finite number"),
    "k bool": (lambda: RowCountWithinSigma(k=True), "k must be a finite number"),
    "history of one": (lambda: RowCountWithinSigma(min_history=1), "min_history must be >= 2"),
    "last below history": (lambda: RowCountWithinSigma(last=3), "last .*must be >= 5"),
    "share of one": (lambda: FailingShare("a > 0", max_share=1), "below 1"),
    "negative share": (lambda: FailingShare("a > 0", max_share=-0.1), "must be >= 0"),
    "nan share": (lambda: FailingShare("a > 0", max_share=math.nan), "finite number"),
    "drop a count": (lambda: RowCount(min=1, action="drop"), "drop is for row conditions"),
    "drop a sigma": (lambda: RowCountWithinSigma(action="drop"), "drop is for row conditions"),
    "drop a share": (lambda: FailingShare("a > 0", action="drop"), "drop is for row"),
    "drop a check": (lambda: Check(a_check, action="drop"), "drop is for row conditions"),
    "unknown action": (lambda: RowCondition("a > 0", action="quarantine"), "one of"),
    "not callable": (lambda: Check("a_check"), "Check needs a callable"),
    "unnamed lambda": (_lambda_check, "name= for a lambda"),
    "name on two lines": (lambda: RowCount(min=1, name="a\nb"), "one line"),
    "blank name": (lambda: RowCount(min=1, name="   "), "one line of 1 to 200"),
    "long name": (lambda: RowCount(min=1, name="n" * 201), "one line of 1 to 200"),
}


@pytest.mark.parametrize("case", sorted(BAD_DECLARATIONS))
def test_a_bad_declaration_is_refused_as_it_is_built(case):
    declare, message = BAD_DECLARATIONS[case]
    with pytest.raises(ValueError, match=message):
        declare()


@pytest.mark.parametrize("on", ["", "two words", "orders;", "ördersё", None])
def test_on_names_the_input_or_an_output_by_the_house_name_rule(on):
    with pytest.raises(InvalidNameError) as raised:
        RowCondition("a > 0", on=on)
    assert isinstance(raised.value, TxnConfigError) and isinstance(raised.value, ValueError)


def test_a_named_lambda_and_a_named_callable_object_are_checks():
    assert Check(lambda rows: (True, ""), name="not empty").name == "not empty"

    class Callable:
        def __call__(self, data):
            return True, ""

    assert Check(Callable(), name="callable").name == "callable"
    with pytest.raises(ValueError, match="name="):
        Check(Callable())


def test_a_set_of_expectations_needs_distinct_names():
    first, second = RowCondition("a > 0"), RowCondition("a > 0", on="orders")
    assert check_declared([first, second]) == (first, second)
    assert check_declared(x for x in [first]) == (first,)
    with pytest.raises(ValueError, match=r"must differ \(give name=\): \['input: a > 0'\]"):
        check_declared([first, RowCondition("a  >  0", action="fail")])
    with pytest.raises(ValueError, match=r"\['same'\]"):
        check_declared([RowCount(min=1, name="same"), RowCondition("b", name="same")])
    with pytest.raises(ValueError, match="expectations are RowCondition"):
        check_declared([first, "a > 0"])


def test_the_failing_rows_are_those_the_condition_is_not_true_of():
    assert FAILING_ROWS.format("a >= 0") == "(a >= 0\n) IS NOT TRUE"
    # a trailing SQL comment ends at the newline, not at the end of the query
    assert FAILING_ROWS.format("a >= 0 -- why").endswith("\n) IS NOT TRUE")


# -- what was measured -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rows_checked": 3, "rows_failed": 4}, "rows_checked must be >= 4"),
        ({"rows_checked": -1}, "rows_checked must be >= 0"),
        ({"rows_checked": 2, "rows_failed": -1}, "rows_failed must be >= 0"),
        ({"rows_checked": True}, "rows_checked must be a finite int"),
        ({"rows_checked": 2.0}, "rows_checked must be a finite int"),
        ({"rows_checked": 5, "rows_failed": 1, "sample_keys": ("a", "b")}, "more sample keys"),
        ({"rows_checked": 5, "sample_keys": ("a",)}, "more sample keys"),
    ],
)
def test_a_measurement_that_cannot_be_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Measured("e", **kwargs)


def test_sample_keys_are_kept_as_text():
    assert Measured("e", 9, 2, [17, ("a", 1)]).sample_keys == ("17", "('a', 1)")


# -- the verdict -------------------------------------------------------------------------------


def test_everything_passing_commits_and_quarantines_nothing():
    declared = [
        RowCondition("amount >= 0", action="fail"),
        RowCount(min=1, max=10, action="fail"),
        FailingShare("sku IS NOT NULL", max_share=0.1, action="fail"),
        Check(a_check, action="fail"),
    ]
    names = [e.name for e in declared]
    measured = [
        Measured(names[0], 10),
        Measured(names[1], 10),
        Measured(names[2], 10, 1, ("k1",)),
        Measured(names[3], 10, passed=True, message="data is there"),
    ]
    verdict = judge_expectations(declared, measured)
    assert verdict.commits and verdict.quarantine == {}
    assert [o.taken for o in verdict.outcomes] == [Taken.PASSED] * 4
    assert [o.expectation for o in verdict.outcomes] == names  # in declared order
    assert verdict.outcomes[0].message == "0 of 10 rows fail amount >= 0: passed"
    assert verdict.outcomes[2].sample_keys == ("k1",)
    assert verdict.outcomes[3].message == "data is there: passed"


def test_a_failed_fail_expectation_stops_the_txid_with_a_note_naming_it():
    stop = RowCondition("amount >= 0", on="orders", action="fail")
    also = RowCount(max=5, on="orders", action="fail")
    drop = RowCondition("sku IS NOT NULL", on="orders", action="drop")
    measured = [
        Measured(stop.name, 1000, 3, ("17", "23", "42")),
        Measured(also.name, 1000),
        Measured(drop.name, 1000, 2, ("9", "10")),
    ]
    verdict = judge_expectations([stop, also, drop], measured)
    assert not verdict.commits
    stopped = [o for o in verdict.outcomes if o.taken is Taken.FAILED]
    assert [o.expectation for o in stopped] == [stop.name, also.name]
    assert verdict.quarantine == {}  # nothing commits, so nothing is quarantined
    assert verdict.outcomes[2].taken is Taken.DROPPED  # what its rule said, all the same
    note = poison_note("shop", 7, 2, verdict)
    assert note.startswith("pipeline=shop txid=7 attempt=2: poison batch")
    assert "2 failed expectation(s)" in note
    assert "'orders: amount >= 0' on orders: 3 of 1000 rows fail amount >= 0: failed" in note
    assert "(sample keys: 17, 23, 42)" in note
    assert "'orders: rows <= 5' on orders: 1000 rows, expected rows <= 5: failed" in note
    assert "sku IS NOT NULL" not in note  # a drop expectation stops nothing
    assert "Clear" in note and "\n" not in note


def test_a_committing_txid_has_no_poison_note():
    exp = RowCondition("a > 0", action="warn")
    verdict = judge_one(exp, Measured(exp.name, 4, 4, ("k",)))
    assert verdict.commits and verdict.outcomes[0].taken is Taken.WARNED
    with pytest.raises(ValueError, match="txid 3 commits"):
        poison_note("p", 3, 1, verdict)


def test_drop_expectations_quarantine_by_output():
    declared = [
        RowCondition("a > 0", on="orders", action="drop"),
        RowCondition("b > 0", on="orders", action="drop"),
        RowCondition("c > 0", on="orders", action="drop"),  # fails no row
        RowCondition("d > 0", on="lines", action="drop"),
        RowCondition("e > 0", on="lines", action="warn"),
    ]
    failed = [3, 1, 0, 2, 5]
    measured = [Measured(e.name, 10, f) for e, f in zip(declared, failed, strict=True)]
    verdict = judge_expectations(declared, measured)
    assert verdict.commits
    assert verdict.quarantine == {
        "orders": ("orders: a > 0", "orders: b > 0"),
        "lines": ("lines: d > 0",),
    }
    taken = [o.taken for o in verdict.outcomes]
    assert taken == [Taken.DROPPED, Taken.DROPPED, Taken.PASSED, Taken.DROPPED, Taken.WARNED]
    assert verdict.outcomes[0].message == "3 of 10 rows fail a > 0: dropped"


def test_an_outcome_keeps_a_few_short_failing_keys_and_one_line():
    exp = RowCondition("a > 0", action="fail")
    keys = [f"key-{i}" for i in range(SAMPLE_KEYS + 3)] + ["k" * 500]
    outcome = outcome_of(exp, Measured(exp.name, 100, 50, keys))
    assert outcome.sample_keys == tuple(keys[:SAMPLE_KEYS])
    long = outcome_of(exp, Measured(exp.name, 100, 1, ["k" * 500]))
    assert len(long.sample_keys[0]) == 100 and long.sample_keys[0].endswith("...")
    check = Check(a_check)
    said = outcome_of(check, Measured(check.name, 3, passed=False, message="no\nrows\n"))
    assert said.message == "no rows: warned"


@pytest.mark.parametrize(
    ("declared", "measured", "history", "problem"),
    [
        ([RowCount(min=1)], [], None, r"declared \['input: rows >= 1'\], measured \[\]"),
        ([], [Measured("ghost", 1)], None, r"measured \['ghost'\]"),
        (
            [RowCount(min=1)],
            [Measured("input: rows >= 1", 1), Measured("input: rows >= 1", 2)],
            None,
            "measured",
        ),
        (
            [RowCount(min=1), RowCount(max=1)],
            [Measured("input: rows >= 1", 1)],
            None,
            r"measured \['input: rows >= 1'\]",
        ),
        ([Check(a_check)], [Measured("input: a_check", 1)], None, "without its answer"),
        (
            [RowCountWithinSigma()],
            [Measured("input: rows within 3.0 sigma of the last 20", 1)],
            None,
            "no history given",
        ),
        (
            [RowCountWithinSigma()],
            [Measured("input: rows within 3.0 sigma of the last 20", 1)],
            {"input: rows within 3.0 sigma of the last 20": [1, -2]},
            "history must be >= 0",
        ),
    ],
    ids=["missing", "undeclared", "doubled", "one of two missing", "check", "sigma", "negative"],
)
def test_what_was_not_measured_is_an_error_never_a_pass(declared, measured, history, problem):
    with pytest.raises(ValueError, match=problem):
        judge_expectations(declared, measured, history)


def test_a_row_count_bound_is_inclusive():
    exp = RowCount(min=2, max=4, action="fail")
    taken = [outcome_of(exp, Measured(exp.name, n)).taken for n in range(7)]
    assert taken == [Taken.FAILED] * 2 + [Taken.PASSED] * 3 + [Taken.FAILED] * 2
    assert (
        outcome_of(exp, Measured(exp.name, 9)).message == "9 rows, expected rows in [2, 4]: failed"
    )


def test_a_failing_share_is_the_limit_as_written():
    exp = FailingShare("sku IS NOT NULL", max_share=0.3, action="fail")  # 0.3 is below 3/10
    assert outcome_of(exp, Measured(exp.name, 10, 3)).taken is Taken.PASSED
    odd = FailingShare("sku IS NOT NULL", max_share=0.29, action="fail")
    assert 0.29 * 100 < 29  # in floats, 29 of 100 would be over a limit of 0.29
    assert outcome_of(odd, Measured(odd.name, 100, 29)).taken is Taken.PASSED
    assert outcome_of(odd, Measured(odd.name, 100, 30)).taken is Taken.FAILED
    assert outcome_of(exp, Measured(exp.name, 10, 4)).taken is Taken.FAILED
    assert outcome_of(exp, Measured(exp.name, 0)).taken is Taken.PASSED  # an empty batch
    none = FailingShare("sku IS NOT NULL", max_share=0, action="fail")
    assert outcome_of(none, Measured(none.name, 10**6, 1)).taken is Taken.FAILED
    said = outcome_of(exp, Measured(exp.name, 10, 4)).message
    assert said == "4 of 10 rows fail sku IS NOT NULL; at most 30.00%: failed"


def test_the_sigma_bound_uses_the_sample_standard_deviation():
    # history 10, 12, 14: mean 12, sample sigma 2 (the population's is 1.63): k = 1.5 allows 3
    exp = RowCountWithinSigma(k=1.5, last=3, min_history=3, action="fail")
    taken = {n: outcome_of(exp, Measured(exp.name, n), [10, 12, 14]).taken for n in range(7, 18)}
    assert [n for n, t in taken.items() if t is Taken.PASSED] == list(range(9, 16))
    assert statistics.pstdev([10, 12, 14]) * 1.5 < 3  # the population's would fail 9 and 15
    said = outcome_of(exp, Measured(exp.name, 16), [10, 12, 14]).message
    assert said == "16 rows; the last 3 committed txids: mean 12.0, sigma 2.0, k 1.5: failed"


def test_with_no_spread_only_the_mean_passes():
    exp = RowCountWithinSigma(k=100, min_history=2, action="fail")
    for n, taken in [(6, Taken.FAILED), (7, Taken.PASSED), (8, Taken.FAILED)]:
        assert outcome_of(exp, Measured(exp.name, n), [7, 7, 7]).taken is taken


def test_the_sigma_bound_reads_only_the_last_txids():
    exp = RowCountWithinSigma(k=1, last=4, min_history=2, action="fail")
    old = [10**6, 0, 10**6]  # beyond the last 4: would make anything pass
    assert outcome_of(exp, Measured(exp.name, 500), [*old, 100, 100, 101, 99]).taken is Taken.FAILED
    assert outcome_of(exp, Measured(exp.name, 500), [*old[1:], 100, 100, 101]).taken is Taken.PASSED


def test_a_young_sigma_bound_passes_and_says_so():
    exp = RowCountWithinSigma(action="fail")  # needs 5 committed txids
    for history in ([], [10], [10, 10, 10, 10]):
        verdict = judge_one(exp, Measured(exp.name, 10**6), history)
        outcome = verdict.outcomes[0]
        assert verdict.commits and outcome.taken is Taken.NOT_ENOUGH_HISTORY
        expected = f"1000000 rows; {len(history)} committed txids of 5 needed: not_enough_history"
        assert outcome.message == expected
    later = judge_one(exp, Measured(exp.name, 10**6), [10] * 5)
    assert later.outcomes[0].taken is Taken.FAILED


# -- properties against plain Python -----------------------------------------------------------

ROWS = st.lists(
    st.fixed_dictionaries({"a": st.integers(-3, 3) | st.none(), "b": st.integers(-3, 3)}),
    max_size=25,
)
CONDITIONS = {  # SQL text -> what it means, applied by plain Python (NULL fails, as in SQL)
    "a >= 0": lambda r: r["a"] is not None and r["a"] >= 0,
    "a <> 1": lambda r: r["a"] is not None and r["a"] != 1,
    "b < 2": lambda r: r["b"] < 2,
    "b <> 0": lambda r: r["b"] != 0,
    "a IS NOT NULL": lambda r: r["a"] is not None,
}
OUTPUTS = ("orders", "lines", INPUT)


@st.composite
def audits(draw):
    """A txid's batch per output, expectations of every kind with random actions, their
    measurements by plain Python, and each expectation's failure by plain Python too."""
    batches = {on: draw(ROWS) for on in OUTPUTS}
    declared, measured, failed, history = [], [], {}, {}
    for i in range(draw(st.integers(0, 8))):
        on = draw(st.sampled_from(OUTPUTS))
        rows = batches[on]
        kind = draw(st.sampled_from(["row", "count", "sigma", "share", "check"]))
        sql = draw(st.sampled_from(sorted(CONDITIONS)))
        bad = [j for j, r in enumerate(rows) if not CONDITIONS[sql](r)]
        keys = [f"{on}#{j}" for j in bad[: draw(st.integers(0, 3))]]
        name = f"e{i}"
        if kind == "row":
            action = draw(st.sampled_from(list(Action)))
            declared.append(RowCondition(sql, on=on, action=action, name=name))
            measured.append(Measured(name, len(rows), len(bad), keys))
            failed[name] = bool(bad)
            continue
        action = draw(st.sampled_from([Action.WARN, Action.FAIL]))
        if kind == "count":
            low, high = sorted(draw(st.lists(st.integers(0, 30), min_size=2, max_size=2)))
            declared.append(RowCount(min=low, max=high, on=on, action=action, name=name))
            failed[name] = not low <= len(rows) <= high
        elif kind == "sigma":
            k = draw(st.integers(1, 30)) / 10
            past = draw(st.lists(st.integers(0, 30), max_size=8))
            declared.append(
                RowCountWithinSigma(k=k, last=5, min_history=3, **_as(on, action, name))
            )
            history[name] = past
            failed[name] = len(past[-5:]) >= 3 and not _sigma_oracle(len(rows), past[-5:], k)
        elif kind == "share":
            percent = draw(st.integers(0, 99))
            declared.append(FailingShare(sql, max_share=percent / 100, **_as(on, action, name)))
            failed[name] = Fraction(len(bad), max(len(rows), 1)) > Fraction(percent, 100)
            measured.append(Measured(name, len(rows), len(bad), keys))
            continue
        else:
            ok = draw(st.booleans())
            declared.append(Check(a_check, on=on, action=action, name=name))
            measured.append(Measured(name, len(rows), passed=ok, message="said so"))
            failed[name] = not ok
            continue
        measured.append(Measured(name, len(rows)))
    return batches, declared, measured, failed, history


def _as(on, action, name):
    return {"on": on, "action": action, "name": name}


def _sigma_oracle(count, past, k):
    """The sigma rule in plain Python: sample variance by its definition, in fractions."""
    mean = Fraction(sum(past), len(past))
    variance = sum((x - mean) ** 2 for x in past) / (len(past) - 1)
    return (count - mean) ** 2 <= Fraction(str(k)) ** 2 * variance


@settings(max_examples=300, deadline=None)
@given(audits())
def test_a_txid_stops_iff_a_fail_expectation_failed(audit):
    _, declared, measured, failed, history = audit
    verdict = judge_expectations(declared, measured, history)
    stops = any(failed[e.name] and e.action is Action.FAIL for e in declared)
    assert verdict.commits is not stops
    for exp, outcome in zip(declared, verdict.outcomes, strict=True):
        assert outcome.expectation == exp.name and outcome.on == exp.on
        if failed[exp.name]:
            assert (
                outcome.taken.value
                == {"warn": "warned", "drop": "dropped", "fail": "failed"}[exp.action]
            )
        else:
            assert outcome.taken in (Taken.PASSED, Taken.NOT_ENOUGH_HISTORY)
        assert "\n" not in outcome.message and outcome.message.endswith(outcome.taken.value)


@settings(max_examples=300, deadline=None)
@given(audits())
def test_the_quarantined_rows_are_exactly_those_the_drop_expectations_fail(audit):
    batches, declared, measured, _, history = audit
    verdict = judge_expectations(declared, measured, history)
    by_name = {e.name: e for e in declared}
    for on, rows in batches.items():
        leaving = [by_name[n] for n in verdict.quarantine.get(on, ())]
        assert all(e.action is Action.DROP and e.on == on for e in leaving)
        quarantined = [r for r in rows if any(not CONDITIONS[e.condition](r) for e in leaving)]
        committed = [r for r in rows if all(CONDITIONS[e.condition](r) for e in leaving)]
        # the batch, exactly: nothing lost, nothing doubled
        assert Counter(map(repr, quarantined + committed)) == Counter(map(repr, rows))
        drops = [e for e in declared if e.on == on and e.action is Action.DROP]
        union = [r for r in rows if any(not CONDITIONS[e.condition](r) for e in drops)]
        assert quarantined == (union if verdict.commits else [])


@settings(max_examples=300, deadline=None)
@given(audits(), st.randoms(use_true_random=False))
def test_warn_never_changes_what_commits(audit, rnd: random.Random):
    _, declared, measured, _, history = audit
    verdict = judge_expectations(declared, measured, history)
    warned = {e.name for e in declared if e.action is Action.WARN}
    # whatever a warn expectation measured, or without it, the same commits and quarantine
    kept = [e for e in declared if e.name not in warned]
    without = judge_expectations(
        kept, [m for m in measured if m.expectation not in warned], history
    )
    assert (without.commits, without.quarantine) == (verdict.commits, verdict.quarantine)
    changed = [
        dataclasses.replace(
            m, rows_failed=m.rows_checked, passed=False if m.passed is not None else None
        )
        if m.expectation in warned
        else m
        for m in measured
    ]
    worse = judge_expectations(declared, changed, history)
    assert (worse.commits, worse.quarantine) == (verdict.commits, verdict.quarantine)
    shuffled = list(measured)
    rnd.shuffle(shuffled)
    assert judge_expectations(declared, shuffled, history) == verdict  # measured in any order


COUNTS = st.integers(0, 10**6)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(COUNTS, min_size=2, max_size=30),
    COUNTS,
    st.floats(0.01, 10, allow_nan=False) | st.integers(1, 10),
)
def test_the_sigma_rule_is_the_sample_standard_deviations(past, count, k):
    exp = RowCountWithinSigma(k=k, last=30, min_history=2, action="fail")
    passed = outcome_of(exp, Measured(exp.name, count), past).taken is Taken.PASSED
    assert passed == _sigma_oracle(count, past, k)  # exactly, bound included
    mean, sd = statistics.fmean(past), statistics.stdev(past)
    margin = abs(abs(count - mean) - k * sd)
    assume(margin > 1e-6 * max(1.0, abs(count - mean)))  # away from the bound, floats agree
    assert passed == (abs(count - mean) <= k * sd)


@given(st.integers(0, 10**6), st.integers(1, 10**4), st.integers(1, 20))
def test_at_the_bound_a_count_passes_and_one_past_it_fails(mean, spread, k):
    # history mean - s, mean, mean + s: sample sigma s exactly, so k sigma is k * s rows
    exp = RowCountWithinSigma(k=k, min_history=3, action="fail")
    history = [mean + spread, mean, mean - spread] if mean >= spread else None
    assume(history is not None)
    for count, taken in [
        (mean + k * spread, Taken.PASSED),
        (mean + k * spread + 1, Taken.FAILED),
        (mean - k * spread - 1, Taken.FAILED),
    ]:
        if count >= 0:
            assert outcome_of(exp, Measured(exp.name, count), history).taken is taken


def test_an_outcome_is_recorded_as_json_and_a_failed_fail_one_marks_a_poison_batch():
    import json

    from airflow_txn_provider.rules.expectations import failed_a_fail_expectation, outcome_record

    rule = RowCondition(on="s", condition="delta > 0", action="fail", name="pos")
    verdict = judge_expectations([rule], [Measured("pos", 3, 1, ("k",))])
    record = outcome_record(verdict.outcomes[0])
    assert json.loads(json.dumps(record)) == record
    assert record["taken"] == "failed" and record["sample_keys"] == ["k"]
    assert failed_a_fail_expectation([record])
    assert not failed_a_fail_expectation([{**record, "taken": "warned"}])
    assert not failed_a_fail_expectation(None)


# -- the JSON spec a spark-submitted job receives its expectations in ----------------------------


def test_the_sql_expectations_survive_a_json_spec_round_trip_and_a_check_has_none():
    import json

    from airflow_txn_provider.rules.expectations import expectation_from_spec, expectation_spec

    declared = [
        RowCondition(on=INPUT, condition="amount >= 0 -- no refunds", action="fail"),
        FailingShare(on="lake", condition="sku IS NOT NULL", max_share=0.25, name="skus"),
        RowCount(on=INPUT, max=10),
        RowCount(on="lake", min=1, max=2_000_000, action="fail"),
        RowCountWithinSigma(on=INPUT, k=2.5, last=7, min_history=3, action="warn"),
    ]
    for exp in declared:
        spec = json.loads(json.dumps(expectation_spec(exp)))  # what travels, as text
        assert spec["kind"] == type(exp).__name__ and spec["name"] == exp.name
        back = expectation_from_spec(spec)
        assert back == exp and type(back) is type(exp) and back.action is exp.action
    with pytest.raises(ValueError, match="cannot travel as JSON"):
        expectation_spec(Check(on=INPUT, fn=lambda rows: (True, ""), name="c"))
    with pytest.raises(ValueError, match="not an expectation's spec"):
        expectation_from_spec({"kind": "Check", "on": INPUT})
    with pytest.raises(ValueError, match="unknown field"):
        expectation_from_spec({**expectation_spec(declared[0]), "max_share": 0.1})
    with pytest.raises(ValueError, match="must be below 1"):  # checked as a declaration is
        expectation_from_spec({**expectation_spec(declared[1]), "max_share": 1.5})
