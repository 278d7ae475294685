"""``rlm recover``: rebuild the metadata topic from the store alone (:mod:`rlm.recovery`), with a progress bar."""

from __future__ import annotations

import argparse
import shutil
import sys
import uuid

from tqdm import tqdm

from rlm.cli.context import (
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    add_config_arg,
    add_timeout_arg,
    cluster_errors,
    open_rlmm,
    reach_cluster,
)
from rlm.config import ConfigError, SidecarSettings, load_settings
from rlm.discovery import ClusterView
from rlm.recovery import ClusterTopic, Recoverer, RecoveryReport, map_partitions
from rlm.state import StateDir
from rsm.manager import RemoteStorageManager

__all__ = ["register"]


def _mapping(text: str) -> tuple[uuid.UUID, str]:
    old, sep, name = text.partition("=")
    try:
        if not sep or not name:
            raise ValueError
        return uuid.UUID(old), name
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected OLD_TOPIC_ID=NAME (a topic id as a UUID)") from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "recover", help="rebuild the metadata topic from the store alone",
        description="Rebuild the metadata topic from the store alone: every committed copy (one with its index "
                    "object), one chain per partition by leader-epoch lineage (as readers choose), written as "
                    "COPY_SEGMENT_STARTED + COPY_SEGMENT_FINISHED records; segments the metadata already knows are "
                    "not written again. Copies left out are reported as orphans, never deleted. Topics are matched "
                    "by name (the cluster's current topic id) unless --map says otherwise.",
        epilog=f"exit codes: 0 done; 1 done, with conflicts (listed); {EXIT_USAGE} bad arguments or config; "
               f"{EXIT_UNREACHABLE} the Kafka cluster did not answer within --timeout (nothing was written)")
    add_config_arg(p)
    add_timeout_arg(p)
    p.add_argument("--topic", action="append", default=None, metavar="T",
                   help="recover only this topic (of the cluster; repeatable)")
    p.add_argument("--map", action="append", default=[], type=_mapping, metavar="OLD_TOPIC_ID=NAME",
                   help="recover the stored topic id OLD_TOPIC_ID as the cluster's topic NAME (repeatable)")
    p.add_argument("--dry-run", action="store_true", help="write nothing; print what would be written")
    p.set_defaults(func=run)


def _bar(total: int, what: str):
    bar = tqdm(total=total, desc=what, unit="", file=sys.stderr, disable=None, leave=False)

    def update(n: int) -> None:
        bar.update(n)
        if bar.n >= total:
            bar.close()
    if total == 0:
        bar.close()
    return update


def run(args: argparse.Namespace) -> int:
    try:
        settings = load_settings(args.config)
    except ConfigError as err:
        print(f"rlm: {err}", file=sys.stderr)
        return EXIT_USAGE
    explicit = dict(args.map)
    settings.metadata.state_dir.mkdir(parents=True, exist_ok=True)
    with cluster_errors(settings.kafka.bootstrap_servers):
        reach_cluster(settings.kafka.client_config(), args.timeout)  # before the store is listed
        return _recover(args, settings, explicit)


def _recover(args: argparse.Namespace, settings: SidecarSettings, explicit: dict[uuid.UUID, str]) -> int:
    # A cache of its own, dropped at the end: only the partitions recovered are read, and a lost metadata topic
    # must never be taken for the one a kept cache remembers.
    cache_dir = StateDir(settings.metadata.state_dir).new_recover_cache()
    rsm = RemoteStorageManager(settings.store)
    view = ClusterView(settings.kafka.client_config(), timeout_s=args.timeout)
    recoverer = None
    try:
        metadata_exists = bool(view.partitions([settings.metadata.topic], skip_unauthorized=True))
        # Recovery writes the metadata topic on purpose (creating it if absent), in read-only mode too: it is how a
        # read-only cluster gets metadata of a store it does not own. It never writes to the store.
        recoverer = Recoverer(rsm, lambda: open_rlmm(settings, args.timeout, cache_dir=cache_dir,
                                                     create_topic=True, read_only=False),
                              metadata_exists=metadata_exists, progress=_bar)
        stored = recoverer.stored_partitions()
        unknown = set(explicit) - {sp.topic_id for sp in stored}
        for old in sorted(unknown, key=str):
            print(f"rlm: --map {old}={explicit[old]}: no such topic id in the store", file=sys.stderr)
        names = {sp.topic_name for sp in stored} | set(explicit.values())
        cluster: dict[str, ClusterTopic] = {}
        for info in view.partitions(sorted(names), skip_unauthorized=True).values():
            t = cluster.get(info.topic)
            parts = (t.partitions if t else frozenset()) | {info.partition}
            cluster[info.topic] = ClusterTopic(info.topic, info.topic_id, frozenset(parts))
        mapped, skipped = map_partitions(stored, cluster, explicit=explicit, topics=args.topic)
        report = RecoveryReport(skipped=skipped)
        recoverer.run(mapped, dry_run=args.dry_run, report=report)
    finally:
        if recoverer is not None:
            recoverer.close()
        view.close()
        rsm.close()
        shutil.rmtree(cache_dir, ignore_errors=True)
    _print(report)
    return 1 if report.all_conflicts else 0


def _print(report: RecoveryReport) -> None:
    verb = "would write" if report.dry_run else "recovered"
    for pr in report.partitions:
        for sp in pr.sources:
            if (sp.topic_id, sp.topic_name) != (pr.target.topic_id, pr.target.topic):
                print(f"{sp} -> {pr.target}")
        for md in pr.written:
            print(f"{verb} {pr.target.topic}-{pr.target.partition} {md.start_offset}..{md.end_offset_inclusive} "
                  f"{md.segment_size_bytes} bytes segment {md.remote_log_segment_id.id}")
        for o in pr.orphans:
            print(f"orphan {o.name}: {o.reason}")
    for sp, reason in report.skipped:
        print(f"skipped {sp}: {reason}")
    for c in report.all_conflicts:
        print(f"conflict {c}")
    print(report.summary())
