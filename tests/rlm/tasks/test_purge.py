"""The deleted-topic rule (rlm.tasks.purge.DeletionEvidence) on fake answers: positive proof over rounds and a grace
period purges; absence, authorization errors, timeouts and the live id never do, and they reset the count. And the
purge itself (rlm.tasks.purge.purge_partition, purge_deleted_topics) on fakes: the partition-delete states around the
segment deletes and the staging release, in order."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import KafkaError

from rlm import metrics
from rlm.discovery import TopicLookup
from rlm.tasks.purge import DeletionEvidence, deletion_evidence, purge_deleted_topics, purge_partition
from rlmm.api import InvalidStateTransitionError, RemotePartitionDeleteState, TopicIdPartition

X, Y = uuid.uuid4(), uuid.uuid4()
P0, P1 = TopicIdPartition(X, "orders", 0), TopicIdPartition(X, "orders", 1)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def live(tid: uuid.UUID = X) -> dict[str, TopicLookup]:
    return {"orders": TopicLookup("orders", topic_id=tid)}


def error(code: int) -> dict[str, TopicLookup]:
    return {"orders": TopicLookup("orders", error_code=code, error=KafkaError(code).str())}


UNKNOWN = error(KafkaError.UNKNOWN_TOPIC_OR_PART)
DENIED = error(KafkaError.TOPIC_AUTHORIZATION_FAILED)


def rounds(ev: DeletionEvidence, clock: Clock, answers: list[dict[str, TopicLookup]], step_s: float = 10.0,
           known: list[TopicIdPartition] | None = None) -> list[list[TopicIdPartition]]:
    out = []
    for a in answers:
        out.append(ev.observe(known or [P0, P1], a))
        clock.t += step_s
    return out


def test_evidence_kinds() -> None:
    assert deletion_evidence(X, UNKNOWN["orders"]) == "unknown topic"
    assert deletion_evidence(X, live(Y)["orders"]) == f"re-created as {Y}"
    assert deletion_evidence(X, live(X)["orders"]) is None
    assert deletion_evidence(X, None) is None
    for code in (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError._TIMED_OUT, KafkaError._TRANSPORT,
                 KafkaError.LEADER_NOT_AVAILABLE, None):
        assert deletion_evidence(X, TopicLookup("orders", error_code=code)) is None


def test_purged_only_after_rounds_and_grace() -> None:
    clock = Clock()
    ev = DeletionEvidence(grace_ms=25_000, min_rounds=3, clock=clock)
    # t=0,10,20: three rounds but only 20 s; t=30: 30 s >= 25 s grace -> proven, both partitions.
    got = rounds(ev, clock, [UNKNOWN] * 4)
    assert got[:3] == [[], [], []]
    assert got[3] == [P0, P1]


def test_rounds_needed_even_when_grace_passed() -> None:
    clock = Clock()
    ev = DeletionEvidence(grace_ms=1_000, min_rounds=3, clock=clock)
    assert rounds(ev, clock, [UNKNOWN] * 3, step_s=3600) == [[], [], [P0, P1]]


def test_recreated_topic_proves_the_old_id_only() -> None:
    clock = Clock()
    ev = DeletionEvidence(grace_ms=0, min_rounds=2, clock=clock)
    new = TopicIdPartition(Y, "orders", 0)
    got = rounds(ev, clock, [live(Y)] * 2, known=[P0, new])
    assert got == [[], [P0]]


@pytest.mark.parametrize("interruption", [
    DENIED, error(KafkaError._TIMED_OUT), error(KafkaError._TRANSPORT), live(X), {},
], ids=["unauthorized", "timeout", "transport", "live-again", "not-answered"])
def test_any_other_answer_resets_the_evidence(interruption: dict[str, TopicLookup]) -> None:
    clock = Clock()
    ev = DeletionEvidence(grace_ms=15_000, min_rounds=2, clock=clock)
    got = rounds(ev, clock, [UNKNOWN, interruption, UNKNOWN, UNKNOWN])
    # Without the interruption the 3rd round (20 s, 2 rounds) would purge; after it the count starts over.
    assert got == [[], [], [], []]
    assert rounds(ev, clock, [UNKNOWN]) == [[P0, P1]]  # 20 s and 3 rounds since the restart of the count


def test_authorization_error_never_purges_and_is_counted() -> None:
    clock = Clock()
    ev = DeletionEvidence(grace_ms=0, min_rounds=1, clock=clock)
    before = metrics.PURGE_CHECK_UNAUTHORIZED.labels("orders")._value.get()
    assert rounds(ev, clock, [DENIED] * 10, step_s=3600) == [[]] * 10
    assert metrics.PURGE_CHECK_UNAUTHORIZED.labels("orders")._value.get() == before + 10
    assert ev.pending() == {}


def test_forgotten_ids_are_dropped_and_a_failed_purge_is_retried() -> None:
    clock = Clock()
    ev = DeletionEvidence(grace_ms=0, min_rounds=1, clock=clock)
    assert ev.observe([P0], UNKNOWN) == [P0]
    assert ev.observe([P0], UNKNOWN) == [P0]  # still proven next round (the purge failed: retried)
    assert ev.observe([], UNKNOWN) == []
    assert ev.pending() == {}


def test_failed_round_resets() -> None:
    clock = Clock()
    ev = DeletionEvidence(grace_ms=0, min_rounds=2, clock=clock)
    assert ev.observe([P0], UNKNOWN) == []
    ev.reset()  # discovery failed this round
    assert ev.observe([P0], UNKNOWN) == []
    assert ev.observe([P0], UNKNOWN) == [P0]


@pytest.mark.parametrize(("patch", "field"), [
    ("{purge_rounds: 0}", "tasks.purge_rounds"), ("{purge_grace_ms: -1}", "tasks.purge_grace_ms")])
def test_purge_settings_validated(tmp_path, patch: str, field: str) -> None:  # type: ignore[no-untyped-def]
    from rlm.config import ConfigError, load_settings

    cfg = tmp_path / "sidecar.yaml"
    cfg.write_text("broker_id: 1\nlog_dirs: [/d]\nkafka: {bootstrap_servers: 'h:1'}\ntasks: " + patch + "\n")
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_settings(cfg)
    ok = tmp_path / "ok.yaml"
    ok.write_text("broker_id: 1\nlog_dirs: [/d]\nkafka: {bootstrap_servers: 'h:1'}\n")
    tasks = load_settings(ok).tasks
    assert (tasks.purge_grace_ms, tasks.purge_rounds) == (60_000, 3)


def test_bad_settings_refused() -> None:
    with pytest.raises(ValueError):
        DeletionEvidence(grace_ms=-1, min_rounds=1)
    with pytest.raises(ValueError):
        DeletionEvidence(grace_ms=0, min_rounds=0)


class PurgeLog:
    """A metadata manager, a deleter and a staging release that write what they are asked into one list."""

    def __init__(self, segments: list[str], got_further: set[RemotePartitionDeleteState] = frozenset()) -> None:
        self.calls: list[tuple] = []
        self.segments = segments
        self.got_further = got_further  # states another sidecar already got past: refused

    def on_partition_leadership_changes(self, leaders, followers) -> None:  # type: ignore[no-untyped-def]
        self.calls.append(("follow", tuple(leaders), tuple(followers)))

    def wait_ready(self, tps, timeout_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
        pass

    def put_remote_partition_delete_metadata(self, md) -> None:  # type: ignore[no-untyped-def]
        if md.state in self.got_further:
            raise InvalidStateTransitionError(f"{md.state} is behind")
        self.calls.append(("state", md.state, md.broker_id))

    def list_remote_log_segments(self, tp):  # type: ignore[no-untyped-def]
        return list(self.segments)

    def delete(self, md, reason: str) -> bool:  # type: ignore[no-untyped-def]
        self.calls.append(("delete", md, reason))
        return True

    def release_partition(self, tp: TopicIdPartition) -> int:
        self.calls.append(("release", tp))
        return 0


def test_purge_partition_walks_the_partition_delete_states() -> None:
    S = RemotePartitionDeleteState
    got = PurgeLog(["s0", "s1"])
    purge_partition(got, got, P0, 7, release_staging=got.release_partition)  # type: ignore[arg-type]
    assert got.calls == [("follow", (), (P0,)), ("state", S.DELETE_PARTITION_MARKED, 7),
                         ("state", S.DELETE_PARTITION_STARTED, 7), ("delete", "s0", "topic-deleted"),
                         ("delete", "s1", "topic-deleted"), ("release", P0), ("state", S.DELETE_PARTITION_FINISHED, 7)]
    # another sidecar got past MARKED and STARTED: skipped, the rest as before
    again = PurgeLog([], got_further={S.DELETE_PARTITION_MARKED, S.DELETE_PARTITION_STARTED})
    purge_partition(again, again, P0, 7, release_staging=again.release_partition)  # type: ignore[arg-type]
    assert again.calls == [("follow", (), (P0,)), ("release", P0), ("state", S.DELETE_PARTITION_FINISHED, 7)]


def test_purge_raced_by_another_sidecars_purge_completes() -> None:
    """Every sidecar that served a deleted topic purges it, at once (seen in the chaos run: the late ones logged
    'purge ... failed ... no such segment' and retried every round): a segment another purger deleted, and a
    FINISHED another purger wrote, are done, not failures."""
    from types import SimpleNamespace

    from rlmm.api import RemotePartitionDeleteMetadata, UnknownSegmentError

    S = RemotePartitionDeleteState
    gone, s1 = SimpleNamespace(remote_log_segment_id="gone"), SimpleNamespace(remote_log_segment_id="s1")

    class Raced(PurgeLog):
        def delete(self, md, reason: str) -> bool:  # type: ignore[no-untyped-def]
            if md is gone:
                raise UnknownSegmentError("no such segment (update to DELETE_SEGMENT_STARTED)")
            return super().delete(md, reason)

        def remote_partition_delete_metadata(self, tp):  # type: ignore[no-untyped-def]
            return RemotePartitionDeleteMetadata(tp, S.DELETE_PARTITION_FINISHED, 1, 2)

    raced = Raced([gone, s1], got_further={S.DELETE_PARTITION_MARKED, S.DELETE_PARTITION_STARTED,
                                               S.DELETE_PARTITION_FINISHED})
    purge_partition(raced, raced, P0, 7, release_staging=raced.release_partition)  # type: ignore[arg-type]
    assert raced.calls == [("follow", (), (P0,)), ("delete", s1, "topic-deleted"), ("release", P0)]

    class NotFinished(Raced):  # FINISHED refused while nobody finished: still an error (retried next round)
        def remote_partition_delete_metadata(self, tp):  # type: ignore[no-untyped-def]
            return RemotePartitionDeleteMetadata(tp, S.DELETE_PARTITION_STARTED, 1, 2)

    stuck = NotFinished([], got_further={S.DELETE_PARTITION_FINISHED})
    with pytest.raises(InvalidStateTransitionError):
        purge_partition(stuck, stuck, P0, 7, release_staging=stuck.release_partition)  # type: ignore[arg-type]


def test_purge_deleted_topics_forgets_purged_and_retries_failed() -> None:
    class Known:
        def __init__(self) -> None:
            self.tps = [P0, P1]

        def all(self) -> list[TopicIdPartition]:
            return list(self.tps)

        def remove(self, tps) -> None:  # type: ignore[no-untyped-def]
            self.tps = [tp for tp in self.tps if tp not in tps]

    class View:
        def topic_ids(self, names):  # type: ignore[no-untyped-def]
            assert set(names) == {"orders"}
            return UNKNOWN

    known, purged = Known(), []

    deferred = [True]

    def purge(tp: TopicIdPartition) -> bool:
        if tp == P1 and not purged.count(P1):
            purged.append(tp)
            raise RuntimeError("store down")
        if tp == P1 and deferred[0]:
            return False  # a copy of it still runs: not purged this round, not an error
        purged.append(tp)
        return True

    ev = DeletionEvidence(grace_ms=0, min_rounds=1, clock=Clock())
    before = metrics.ERRORS.labels("purge")._value.get()
    purge_deleted_topics(known, View(), ev, purge)  # type: ignore[arg-type]
    assert purged == [P0, P1] and known.all() == [P1]
    assert metrics.ERRORS.labels("purge")._value.get() == before + 1
    purge_deleted_topics(known, View(), ev, purge)  # type: ignore[arg-type]
    assert purged == [P0, P1] and known.all() == [P1]  # deferred: kept for the next round
    assert metrics.ERRORS.labels("purge")._value.get() == before + 1
    deferred[0] = False
    purge_deleted_topics(known, View(), ev, purge)  # type: ignore[arg-type]
    assert purged == [P0, P1, P1] and known.all() == []
