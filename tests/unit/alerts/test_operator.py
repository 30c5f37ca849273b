"""What an operator's adjust and rollback carry (alerts.operator): factors checked before
anything is sent, and the checkpoint a rollback goes to, from what the run reported."""

from __future__ import annotations

import pytest

from alerts.operator import OperatorError, adjust_params, rollback_params


def test_adjust_takes_name_equals_number_pairs_and_mappings():
    assert adjust_params(["beta=1.5", "lr=0.5"]) == {"beta": 1.5, "lr": 0.5}
    assert adjust_params([" kl_coef = 2 "]) == {"kl_coef": 2.0}
    assert adjust_params({"beta": 2, "lr": "0.25"}) == {"beta": 2.0, "lr": 0.25}


@pytest.mark.parametrize("given, says", [
    ([], "at least one parameter"),
    (["beta"], "'beta' is not name=number"),
    (["=1.5"], "is not name=number"),
    (["beta="], "is not name=number"),
    (["beta=abc"], "beta=abc: the value must be a number"),
    (["beta=nan"], "must be a factor above 0"),
    (["beta=inf"], "must be a factor above 0"),
    (["beta=-2"], "beta=-2: the value must be a factor above 0"),
    (["lr=0"], "lr=0: the value must be a factor above 0"),
    ([1], "1 is not name=number"),
    (["beta=1.5", "beta=2"], "beta is given twice"),
    (["1beta=2"], "is not a parameter name"),
    (["be ta=2"], "is not a parameter name"),
    ({"beta": True}, "must be a number"),
    ({"beta": None}, "must be a number"),
    ({"": 1.0}, "is not a parameter name"),
])
def test_adjust_refuses_what_is_not_a_factor_with_one_clear_reason(given, says):
    with pytest.raises(OperatorError) as exc:
        adjust_params(given)
    assert says in str(exc.value)


def summary(checkpoints=(), alerts=(), last_step=100):
    return {"run_id": "r", "last_step": last_step, "checkpoints": [list(c) for c in checkpoints],
            "open_alerts": list(alerts)}


CKPTS = [(20, "/ck/20"), (40, "/ck/40"), (60, "/ck/60"), (80, "/ck/80")]


def test_a_rollback_without_a_target_goes_before_the_earliest_of_the_worst_open_alerts():
    alerts = [{"rule": "kl_above_target", "severity": "red", "onset_step": 65,
               "rollback_to": {"step": 60, "checkpoint": "/ck/60"}},
              {"rule": "entropy_collapse", "severity": "red", "onset_step": 50,
               "rollback_to": {"step": 40, "checkpoint": "/ck/40"}},
              {"rule": "kl_rising", "severity": "orange", "onset_step": 30,
               "rollback_to": {"step": 20, "checkpoint": "/ck/20"}}]
    params, why = rollback_params("r", summary(CKPTS, alerts))
    assert params == {"to_step": 40, "checkpoint": "/ck/40"}
    assert "before the onset of its red alert entropy_collapse (step 50)" in why


def test_a_worst_alert_without_a_checkpoint_before_it_is_refused_not_passed_over_for_a_lesser_one():
    """(The red alert's checkpoint, 60, is after the black alert's onset, 30.)"""
    alerts = [{"rule": "kl_above_target", "severity": "black", "onset_step": 30},
              {"rule": "kl_above_target", "severity": "red", "onset_step": 65,
               "rollback_to": {"step": 60, "checkpoint": "/ck/60"}}]
    with pytest.raises(OperatorError) as exc:
        rollback_params("r", summary([(60, "/ck/60")], alerts))
    assert "no checkpoint before the onset of its black alert kl_above_target (step 30" in str(exc.value)


def test_a_rollback_without_a_target_on_a_quiet_run_goes_to_its_newest_checkpoint_not_ahead_of_it():
    params, why = rollback_params("r", summary(CKPTS))
    assert params == {"to_step": 80, "checkpoint": "/ck/80"} and "newest" in why
    assert rollback_params("r", summary(CKPTS, last_step=70))[0] == {"to_step": 60, "checkpoint": "/ck/60"}


def test_a_run_in_trouble_without_a_checkpoint_from_before_is_not_rolled_back_to_a_later_one():
    alerts = [{"rule": "entropy_collapse", "severity": "red", "onset_step": 10}]
    with pytest.raises(OperatorError) as exc:
        rollback_params("r", summary(CKPTS, alerts))
    msg = str(exc.value)
    assert "no checkpoint before the onset of its red alert entropy_collapse (step 10" in msg
    assert "give --to-step N and --checkpoint PATH" in msg


def test_one_half_of_the_target_is_found_among_the_checkpoints_the_run_reported():
    assert rollback_params("r", summary(CKPTS), to_step=40)[0] == {"to_step": 40, "checkpoint": "/ck/40"}
    assert rollback_params("r", summary(CKPTS), checkpoint="/ck/20")[0] == {"to_step": 20, "checkpoint": "/ck/20"}
    with pytest.raises(OperatorError, match="no checkpoint at step 50 .*step 20: /ck/20.*--checkpoint PATH"):
        rollback_params("r", summary(CKPTS), to_step=50)
    with pytest.raises(OperatorError, match="no checkpoint '/elsewhere'.*--to-step N"):
        rollback_params("r", summary(CKPTS), checkpoint="/elsewhere")


def test_an_older_checkpoint_of_the_summary_is_found_and_a_refusal_names_the_newest_few():
    many = [[s, f"/ck/{s}"] for s in range(10, 170, 10)]          # the 16 a summary holds
    assert rollback_params("r", summary(many), to_step=10)[0] == {"to_step": 10, "checkpoint": "/ck/10"}
    with pytest.raises(OperatorError) as exc:
        rollback_params("r", summary(many), to_step=15)
    said = str(exc.value)
    assert "step 130: /ck/130, step 140: /ck/140, step 150: /ck/150, step 160: /ck/160 and 12 older" in said
    assert "/ck/120" not in said and "rlwatch status RUN --json" in said


def test_both_halves_given_go_as_given_even_for_a_run_nobody_has_seen():
    assert rollback_params("r", None, to_step=7, checkpoint="/x/7") == ({"to_step": 7, "checkpoint": "/x/7"},
                                                                         "as given")


@pytest.mark.parametrize("kw, says", [
    ({}, "reported no checkpoint (the SDK's Monitor.log_checkpoint"),
    ({"to_step": -1, "checkpoint": "/x"}, "--to-step must be a step"),
    ({"to_step": 101, "checkpoint": "/x"}, "is at step 100: step 101 is ahead of it"),
    ({"to_step": 5, "checkpoint": " "}, "--checkpoint must be a path"),
    ({"to_step": 5, "checkpoint": 7}, "--checkpoint must be a path"),
])
def test_a_rollback_that_cannot_be_sent_says_why(kw, says):
    with pytest.raises(OperatorError) as exc:
        rollback_params("r", summary(), **kw)
    assert says in str(exc.value)


def test_the_ranks_answers_count_only_as_acks_of_that_command_signed_with_the_secret():
    from alerts.operator import answers_of
    from contract.commands import ack_signature

    def ack(rank, status="applied", command_id="c1", **kw):
        a = {"type": "ack", "command_id": command_id, "run_id": "r", "action": "rollback", "status": status,
             "detail": "", "rank": rank, "ts": 1.0, **kw}
        return {**a, "signature": ack_signature(a, "key")}

    entries = [{"type": "command", "id": "c1", "action": "rollback"}, ack(0), ack(1, command_id="c2"),
               ack(2, "failed"), ack(2), {**ack(3), "status": "ignored"},        # rank 3's is forged
               {**ack(4), "signature": "0" * 64}, "not a dict"]
    got = answers_of(entries, "c1", "key")
    assert sorted(got) == [0, 2] and got[2]["status"] == "applied"          # rank 2's latest
    assert answers_of(entries, "c1", "other key") == {}
    unsigned = [{k: v for k, v in ack(0).items() if k != "signature"}]
    assert answers_of(unsigned, "c1", "key") == {} and list(answers_of(unsigned, "c1", None)) == [0]


def test_the_answers_are_said_in_a_few_words_failures_first():
    from alerts.operator import say_answers

    def a(status, detail=""):
        return {"status": status, "detail": detail}

    assert say_answers({0: a("applied", "paused at step 23")}) == (True, "applied (rank 0): paused at step 23")
    assert say_answers({r: a("applied", f"paused at step {20 + r}") for r in range(8)}) == (
        True, "applied (ranks 0-7)")
    ok, said = say_answers({0: a("applied"), 1: a("applied"), 2: a("ignored", "no on_rollback callback"),
                            3: a("applied"), 5: a("failed", "boom"), 6: a("applied")})
    assert not ok
    assert said == ("ignored (rank 2): no on_rollback callback; failed (rank 5): boom; "
                    "applied (ranks 0-1, 3, 6)")
