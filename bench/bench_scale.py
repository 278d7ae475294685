"""Scale benchmark: one sidecar next to a broker with thousands of partitions (issue 26).

    .venv/bin/python bench/bench_scale.py [--partitions 2000] [--topics 20] [--idle-s 60] [--profile DIR]
    .venv/bin/python bench/bench_scale.py --partitions 4000 --topics 40
    .venv/bin/python bench/bench_scale.py --partitions 500 --topics 5 --skip-default --profile-gil --profile D
    .venv/bin/python bench/bench_scale.py --skip-default --skip-kafka-tiered --baseline DIR [--warm]

``--baseline DIR``: a checkout of another commit (``git archive <commit> | tar -x -C DIR``; the broker is this
checkout's); its sidecar runs beside this one's in the short-interval phase and the burst, on the same broker,
copying the same segments under the same machine load, so their CPU per segment compares side by side (runs of a
loaded machine differ by more than most changes do).

One broker (KRaft, 127.0.0.1) with ``--partitions`` partitions spread over ``--topics`` topics (``segment.ms``
1.5 s; nothing produced yet, and a segment rolls only on an append, so nothing rolls), and one sidecar, ``rlm
serve`` in a child process (its CPU and RSS are its own: ``/proc/<pid>/stat`` and ``status``), filesystem store:

1. idle, default intervals (copy 30 s, discovery 10 s): once the sidecar leads every partition and its first copy
   runs are done, CPU % of one core over ``--idle-s`` seconds, and RSS;
2. idle, short intervals (copy 5 s, discovery 5 s): the same;
3. burst (short intervals, sidecar running): every partition gets ``--segments-per-partition`` rounds of 64 KiB of
   records, 1.6 s apart, so every partition rolls that many segments (the active one is not counted); the sidecar's
   CPU from the first record produced until every rolled segment is remote (its index object in the store), per
   rolled segment, and the same net of its idle CPU over that time; the time to catch up after the last record was
   acknowledged; peak RSS; the broker's CPU over the same time (the produce, the sidecar's requests); the CPU of
   each of the sidecar's threads (``/proc/<pid>/task``; Python 3.11 names none of its own threads: told apart by id);
3b. ``--warm``: once the burst is copied and the sidecar's CPU settled, a second burst of as many segments, measured
   the same way: every partition's first copy (its store and staging directories, its watermark file) is behind it,
   so it is the steady cost of a segment; the cold burst stays the issue's figure;
4. the same burst against Kafka's own tiered storage (``--skip-kafka-tiered`` skips it), once the first broker is
   stopped: a broker of its own with ``LocalTieredStorage`` (:mod:`bench.kafka_tiered`), its RLM task interval 5 s
   (the sidecar's copy interval), the same topics with ``remote.storage.enable``; the broker's CPU idle, then from
   the first record produced until ``LocalTieredStorage`` holds every rolled segment. A last table puts both side by
   side: CPU per rolled segment of the broker and of the sidecar, the time to catch up, peak RSS.

``--profile DIR`` records each idle phase and the burst with py-spy (``py-spy record --pid``, ``--idle`` off: on-CPU
samples only) into ``DIR/idle-<phase>.txt`` and ``DIR/burst.txt`` (collapsed stacks), and prints the functions most
on CPU of each.

Findings (2026-11-25/26, 2,000 partitions, a 2-core machine shared with other test runs, load 3-29; py-spy shares are of
on-CPU samples). Before the log-dir watcher (db57b37): idle 8.6-9.2% of a core at default intervals, 24.7-25.3% at
5 s, 105-112 MiB RSS. Where it went, at 5 s: the copy jobs, 2,000 runs every interval, each asking the cluster for
its leader epoch (ListOffsets through the coalescer, the checkpoint read) and listing its directory: 24%, plus
apscheduler's own dispatch of those runs (~20%); the gauges job's retention margins, listing every led directory and
stat-ing its segments every 5 s: 18% (28% at default intervals); discovery, describing every topic and its configs
and reading every partition.metadata each round: 13%; the stage job listing every led directory: 7%; the metadata
topic's consumer thread (rlmm, a poll every 50 ms) 6-12% and the cleaner's 4-7%.

After (rlm/watch.py; sleeping copy jobs; cheap discovery rounds; margin listings kept): 1.8-1.9% at default
intervals, 2.0-2.3% at 5 s, 113-116 MiB (the watcher's listings and the margins' kept listings). What is left: the
metadata consumer's polling (~31-34%), the cleaner's (~11%), the margins (two stats per led partition every 5 s,
~20%), discovery (one Metadata request a round and one full round a minute, ~13-20%). 4,000 partitions in 40 topics,
after: 4.3% / 4.4%, 148-151 MiB (load 22-29).

The burst (6,000 segments of 64 KiB) is unchanged: 11.1-11.9 ms of CPU per rolled segment from the first record to
the last copy (before 11.9, after 11.1-11.5), catch-up 150-185 s, peak RSS 165-193 MiB (runs differ by the
machine's load more than by the code). Where it goes (py-spy): the store's copy 34% (of which the ledger writer's
zero-filled block buffers, allocated per 64 KiB segment, 13%), staging's hard links 19% (directories made per
segment 5%), directory fsyncs 12% (the copy watermark's durable write per run 9%), the metadata writes and their
read-your-writes waits 10%, the fencing ListOffsets 6%. The "net of idle" figure subtracts the idle rate over the
whole burst: before the watcher that idle work was copy runs that did the burst's work too, so it flatters before.

Those shares were of py-spy's default samples, which count a thread blocked in fsync or librdkafka's flush, or
runnable behind the GIL on a loaded machine, as on CPU. The CPU split (``/proc``: user / system, python / librdkafka
threads, minor faults) and ``--profile-gil`` (only the GIL holder sampled) tell otherwise (2026-11-26, 500 partitions
in 5 topics, 1,500 segments, machine load 8-50): 11.2-12.8 ms per segment, of it 7.0-8.4 ms system time and
0.6-0.7 ms in librdkafka's threads, 1,560-1,870 minor page faults per segment; of the GIL samples 46-53% are the ledger
writer's two block buffers (``bytearray(block_size_bytes)`` per copy: two 4 MiB buffers zero-filled, faulted in and
unmapped for a 64 KiB segment; another 5-8% is their release at the copy's end), the store's CRC scan 5%, the
metadata writes 6%, staging 9%, the fencing and run-start ListOffsets 3-4%. Their cost swings by +-1.5 ms from run
to run (the faults depend on the heap's state), which hides any other change: the copy path's own cuts (issue 26: a
run's segments in batches, one STARTED write, one fencing check and one FINISHED write per batch; concurrent
metadata writers grouped, :mod:`rlmm.group_commit`; a segment staged again checked cheaply) measured 10.7-13.5 ms
against 11.2-12.8 before. With the buffers sized to the blocks they hold (an edit of ``rsm/format/ledger.py`` tried
in a worktree, on both sides, left to the store's owner): before 8.5-9.1 ms, after the cuts 6.7-7.3 ms (metadata
writes 1.1 -> 0.5 ms, fencing and run-start ListOffsets 0.9 -> 0.3 ms of GIL time per segment), peak RSS 149 -> 98
MiB, catch-up 18-24 s -> 10-19 s. What is left per segment then (GIL samples): staging ~20% (the first staging's
mkdir, links, four fsyncs, marker), the stage job's listings ~13%, the store's copy ~10%, the metadata consumer
thread ~8%, metadata writes ~7%, and the discovery and gauges rounds that fall in the burst.

Session 11 (2026-11-26, 2,000 partitions, 6,000 segments). The copy path's file system work cut (f6d88d2: a copy's
data object without its own directory fsync, staging keeps the partition's dir, the watermark overwritten in place):
per segment four inodes made instead of six and eight fsyncs instead of eleven. This machine's ext4 pays most for
making an inode (``perf``: ext4's ``recently_deleted`` scan was a quarter of a single-threaded copy's CPU). Side by
side (``--baseline``, both sidecars copying the same burst, load 30-35): 7.49 ms per segment against 7.88 (-5%),
catch-up 162 s against 185 s. Where it goes now (``--profile-gil``, GIL samples of the burst): the stage job 12.5%,
the copy runs' staging 6.6%, the store's copy 8.6%, metadata writes 6.0%, fencing 2.6%, preparing 2.6%, releasing
1.8% (the copy path, ~46%); apscheduler's dispatch of the copy jobs 11.4% and its "run time was missed" warnings
5.2% (logged, then filtered); discovery 9.5%, gauges 6.7%, the metadata consumer 6.8%, the cleaner 4.3% (periodic
jobs: the longer a loaded burst lasts, the more of them per segment).

Against Kafka's own tiered storage (one run with every cut of the session, load 2-4; the broker's CPU includes the
produce of the burst):

    the burst, side by side                          sidecar (rlm serve)  Kafka's RLM (LocalTieredStorage)
    idle CPU, broker (copy / RLM task interval 5 s)  11.4%                6.5%
    idle CPU, sidecar                                1.8%                 -
    burst CPU per segment, sidecar                   6.47 ms              -
    burst CPU per segment, broker                    5.51 ms              7.50 ms
    burst CPU per segment, broker + sidecar          11.98 ms             7.50 ms
    the same, net of each one's idle CPU             10.86 ms             7.12 ms
    catch-up after the last record acked             21.1 s               8.2 s
    peak RSS of the tiering process                  142 MiB (sidecar)    596 MiB (broker, 2 GiB heap; 542 idle)

Kafka's RLM adds about 2 ms of the broker's CPU per segment (7.50 - 5.51, the broker serving the produce and the
sidecar's requests); the sidecar spends 6.5 ms of its own, about three times that (an earlier run with the first
cuts only, load 17-30: sidecar 7.05, broker 6.25 against 9.33 ms, catch-up 108 s against 50 s). Without the
store's fsyncs (``--store-no-fsync``, another run, load 3-7): 4.24 ms a segment, catch-up 34 s. At 4,000 partitions
in 40 topics (first cuts only, 12,000 segments, load 10-30): sidecar 6.26 ms, broker 4.54 ms in its run; broker
5.66 ms with its RLM (about 1.1 ms for the RLM); catch-up 247 s against 19 s; peak RSS 198 MiB against 1,140 MiB.
``LocalTieredStorage`` never fsyncs (``Files.copy``, no ``force``): its times and CPU have no durable writes in them,
the sidecar's store and staging eight fsyncs a segment (``--store-no-fsync`` drops the store's three).

With every cut of the session (through ff239af; ``--baseline`` at the session's start a7885a8, load 5-11): 5.13
against 5.94 ms per segment (user 2.96, system 2.17), catch-up 42 s against 45 s (through 8242d38: 5.52 against
5.73). The copy path's own system calls went from 272 to 177 a segment (strace of a single-threaded copy: staged,
copied, released), most of a segment's CPU is elsewhere. ``perf record -g`` of the sidecar in a 1,000-partition
burst: 55% of its CPU in the kernel, of it futex waits and wakes (the GIL and locks handed between the copy workers,
the stage job, the scheduler and the metadata consumer: every system call gives the GIL up) 16%, fsync 11%, ext4's
inode allocation 6%. In Python (GIL samples, the last run): the store's copy 16%, the scheduler's dispatch 10% and
its warnings 2%, the stage job 10%, the copy runs' staging 9%, the metadata consumer 7%, metadata writes 6%, the
fencing check 4%, preparing 4%, the rest of the copy runs 8%, gauges, cleaner and discovery 8%.

Session 12 (2026-11-26, 2,000 partitions, 6,000 segments, every run side by side with ``--baseline`` at fe4dbed, the
session's start, on one broker; the machine shared, load 8-36). What the profile showed first: copy workers idle
while the burst waited. apscheduler's dispatch of 2,000 copy jobs (its scheduler thread, an executor queue holding
every woken job, a warning formatted for each job due again while queued) 10% of GIL samples; staging's one lock,
held across each first staging's four fsyncs, made the copy runs wait for the stage job one fsync at a time; the
gauges job listed every changed directory (retention margins) and walked every staged file (staging bytes) every
5 s, and each discovery round read every staged segment's marker: ~25% together in a loaded burst. Cut
(1099ae6..05b2f4c): the copy jobs on a pool of their own (:class:`rlm.tasks.dispatch.CopyJobs`, ``copy_workers``
threads, 6 by default), staging locked per partition, its marker a link named by the end offset (an inode and an
fsync fewer per segment), partition.metadata read again only when it changed, margins listed only for topics with a
local retention, staging bytes counted once per segment, unled staging looked for in full discovery rounds, cheap
discovery rounds comparing nothing per partition, no unlink per store put. Results (sidecar CPU per segment, this
checkout against the baseline beside it; catch-up after the last record):

    load      this checkout        baseline (fe4dbed)    catch-up
    12-16     4.06 ms              4.91 ms   (0.83x)     35.9 s against 70.2 s
    23-31     4.31 ms              5.49 ms   (0.79x)     53.6 s against 107.6 s
    8-12      5.14 ms              6.01 ms   (0.86x)     32.8 s against 74.6 s   (produce 49 s: a loaded start)

Peak RSS 129-139 MiB (idle 108-111 MiB against the baseline's 115-119). With ``copy_workers`` 2 (the old default,
now two copy runs at once where the shared pool let six run): 4.52 against 5.07 ms, catch-up 63.5 against 70.3 s.
Where the rest goes (GIL samples of the last run): the store's copy 16.5% (the batches' CRC scan, the two puts'
Python), staging 21% (the stage job's first stagings 12%, the copy runs' checks 7%, releases 2%), the metadata
topic 22% (writes 11%, the consumer thread 11%), discovery 9% (the Metadata request's 2,000 partition objects every
round 5%, inotify's events), the fencing and run-start ListOffsets 6%, preparing 4%, gauges 3%; system time is 40%
of the CPU (user 3.07 / system 2.08 ms in the last run: fsyncs, ext4's inode allocation, futex hand-offs).

Session 13 (2026-11-26; one run each, the machine shared, load 6-26; the sidecar ran from a working tree that also
held the copy path's uncommitted edits of that hour, so the burst figures are indicative).
2,000 partitions: idle 1.1% at default intervals, 1.2% at 5 s (110 MiB); the burst 4.22 ms of the sidecar's CPU per
segment (user 2.61 / system 1.61; net of idle 3.96), catch-up 93 s, peak RSS 134 MiB; side by side with Kafka's
RLM: broker + sidecar 8.24 ms against the broker with ``LocalTieredStorage`` 8.91 ms a segment (net of idle 6.79
against 8.26), catch-up 93 s against 23 s, peak RSS 134 against 739 MiB. 4,000 partitions: 2.9% / 4.1% measured one
copy interval and 5 s after leading all; py-spy then showed copy runs (their run-start ListOffsets) in the idle
window, most likely first runs of 4,000 partitions outlasting that wait on a loaded machine (a caught-up job
sleeps), so an idle phase now also waits for the sidecar's CPU to settle (:func:`settle`); the next run (another
run, not side by side), settled 10 s later: 2.0% / 2.8%, 138-139 MiB. Note
that py-spy's default samples count the metadata consumer's ``poll(0.05)`` (librdkafka waiting) as on CPU: its
~25% share of the idle samples is wall time, not CPU.

Session 13, later (h5; 1,000 partitions in 10 topics, 3,000 segments a burst, ``--warm``, ``--baseline`` at 21047d1
beside it, load 12.7-18.6): read-your-writes waiters woken only by the batch that applies their offset (1c1e18a) and
the store's request counter keeping its metric children (e8583b0) made no difference the run could see: cold 4.23
against 4.09 ms a segment, warm 3.89 against 3.92 ms (catch-up 22-26 s both). The warm burst costs ~0.3 ms a segment
less than the cold one (user 2.37 / system 1.51 against 2.54 / 1.69 ms): a partition's first copy is not where the
rest of the gap to 3 ms is. Per thread: the six copy workers ~0.45 ms a segment each (~2.7 of the 3.5-3.8 ms of
Python threads), librdkafka's threads 0.4 ms, no other thread above 0.4 ms. At 2,000 partitions (6,000 segments,
load 1.1-8.9, the same two sidecars): cold 4.54 against 4.48 ms (user 2.72 / system 1.82, catch-up 32.7 s both),
warm 3.57 against 3.60 ms (2.08 / 1.49; 28 s): there the first copies are ~1 ms of a cold segment; the six copy
workers 0.51-0.60 ms each cold, 0.41-0.42 warm.

Session 14 (h4; the metadata topic, discovery, fencing; load 10-38 throughout, so every figure is side by side).
``--perf`` of a 500-partition burst (HEAD with 6db7174's staging rounds): the sidecar's samples 54% Python in user
space, system calls 35% (fsync 11.6%, futex 5.8%, openat 4.3%: ``finish_task_switch`` 12% of all samples, the
threads handed off in those calls), librdkafka's threads ~10%. GIL samples by thread (``py-spy --threads``, the first
25 s of that burst): copy workers 48%, the stage job 23% (its staging; the wake-ups 0.8%), the metadata consumer
thread 10.5%, discovery 9% (the Metadata request's list_topics 3.6%, the watcher's reads and rescan 4%). A discovery
round costs 3-5 ms of CPU at 2,000 partitions and a ListOffsets request 0.17-0.2 ms (a fence or a run's start,
shared by the copy runs of the moment): neither is a tenth of a millisecond a segment. The metadata writes alone
(``bench/bench_rlmm_writes.py``: 500 partitions x 3 segments, 6 writers, STARTED and FINISHED per segment) were
0.79-0.90 ms of CPU a segment with ~32 context switches; most of it thread hand-offs (a cache apply of one record is
16 us, a write's check 4-8 us). Cut (c5c006c..9187358: the group commit's writers woken one by one and the lead
handed on, not a notify_all; read-your-writes waiters on locks released outside the consumer's lock; the producer's
delivery reports polled once a second, not every consumer loop; no lock per written record's refusal lookup): 0.66-0.75
against 0.79-0.90 ms, 23 against 31-34 context switches a segment. In the sidecar (``--baseline``: the same HEAD with
50bbde0's ``rlmm``, so only those cuts differ): 500 partitions cold 3.95 against 4.02 ms, warm 3.45 against 3.59;
2,000 partitions cold 4.05 against 4.08 ms (user 2.53 / system 1.52, catch-up 70 s both, load 18-36), warm 3.41
against 3.51 ms: 1-4%, about what the metadata writes are of a segment. Per thread at 2,000 (cold): six copy workers
0.41-0.43 ms each, the stage job 0.43, another scheduler thread 0.32, the metadata consumer 0.21 (warm). The
watcher's events read without an ``Event`` each (b06e891): 1.55 -> 0.72 us per event, about ten a roll. Every cut
of the session at 40a239f against the same HEAD with 50bbde0's ``rlmm`` and watcher (2,000 partitions, load 13-31):
cold 4.76 against 4.75 ms a segment (user 2.98 / system 1.78, catch-up 36 s both), warm 4.06 against 4.16 ms:
what is left of the metadata topic, discovery and fencing is not where the gap to 3 ms is. Idle, with
every cut: 2,000 partitions 1.2% at default intervals, 1.2% at 5 s (112 MiB); 4,000 in 40 topics 2.1% / 2.5% (139
MiB; load 11-19). Named (6a96359, 9baec53: rlm_cluster_calls; the child's threads named for the OS, each
apscheduler job's CPU summed), 2,000 partitions cold at 6a96359 (two runs, load 20-25 and 33-49): 3.36 / 4.10 ms a
segment; copy workers 0.36-0.38 / 0.41-0.42 ms each; "the other scheduler thread" is apscheduler's pool, whose three
threads (0.24 + 0.24 + 0.14 / 0.32 + 0.28 + 0.26) run whichever job is due: stage 0.644 ms a segment (its staging:
the links and fsyncs of the copy path's filesystem side), discovery 0.133 (about 24 rounds in that burst, the full
ones every rescan interval), gauges 0.082; the metadata consumer 0.19 / 0.28. ListOffsets: 0.63 / 0.71 calls a
segment asking 0.94 / 1.09 partitions (a run's start and a batch's fence per ~2 segments; 1.5 partitions a call:
the Coalescer shares a call among the six workers asking at once, no more); Metadata 0.002-0.004 calls a segment.

Session 15 (h3; the burst's CPU outside the copy workers; HEAD's tree exported, ``--baseline`` at 394d052 beside it).
The "ThreadPoolExecutor" threads are apscheduler's pool, nothing else: their CPU sums to the jobs' (stage, discovery,
gauges: 0.80 ms against 0.80 a segment in one run). Cut: the stage job stages from the watcher's listing of a changed
dir (one listing, not two), staging joins paths as strings (pathlib was most of its Python), no stat of a ``.log``
before its link when unbounded (701e0a4); the staging gauge stats only what a segment linked (7ca67bc); full
discovery rounds read ``partition.metadata`` only when it changed, list the log dirs with scandir (ea454ac,
d35bf37: the sidecar's own CPU per full round at 2,000 partitions 112-166 -> 48-77 ms); the metadata group commit's
leader lingers 2 ms while writes follow each other (916ff7f: ``bench_rlmm_writes`` 0.58 -> 0.42 write calls a
segment, CPU 1.39 -> 1.27 ms a segment, medians; wall time mixed on a loaded machine). At d35bf37 (load 12-19):
cold 4.26 against 4.41 ms a segment (user 2.60 / system 1.66; catch-up 35.0 s against 33.8), warm 3.54 against 3.72
(31.5 s both); stage job 0.51 / 0.34 against 0.63 / 0.39, gauges 0.046 / 0.035 against 0.068 / 0.058, the metadata
consumer 0.25 / 0.18 against 0.26 / 0.23, discovery 0.09 / 0.05 against 0.08 / 0.04 (when its full rounds fall in the
burst decides it). At 9cc9b02 (load 18-31): cold 4.33 against 4.51, warm 3.25 against 3.34. What is left of the stage
job a segment: links (five), one fsync of the partition's staging dir, the listing of that dir, and in a cold burst
each partition's first mkdir (~0.6 ms of CPU each on this machine's ext4: 2,000 of them are ~0.2 ms a cold segment).

Session 16 (h2; copy runs coalesced: ``tasks.copy_coalesce_ms``; every figure side by side, load 15-45). The segments
a copy run copies are now counted (``rlm_copy_run_segments``: ``copy_runs`` a segment in the calls rows, the
baseline's too): 0.46-0.54 runs a segment in every burst measured, cold or warm, so about two segments a run
already without coalescing. A partition's wakes come from the stage job, at most one a stage interval (5 s here),
and on a loaded machine the backlog of woken jobs holds each one until more of its rolls are there. Coalescing at
2 s (the default) against 0, the same code otherwise (two trees at 79c3a51, load 25-38): 0.475 against 0.457 runs
a segment cold, 0.475 against 0.476 warm; 4.66 against 4.71 ms a segment cold, 4.03 against 3.96 warm: no
difference. At 10 s against 0 (a tree of the same hour whose reruns still went in place; load 20-36; the burst's
rounds were produced 20-35 s apart): 0.542 runs a segment,
5.09 against 5.09 ms cold, 5.31 against 5.38 warm. A window shorter than the stage interval acts only on a change
seen during a run (its rerun, now through the scheduler); a longer one only where a partition rolls again within
it, which this loaded burst's partitions did not. The copy's CRC scan zero-filled a 1 MiB read buffer for every
64 KiB segment (``rsm.log.batch``, now sized to what is left to scan: ~100 -> ~50 us a scan, one thread): HEAD at
1582aba against it without this session's two changes (load 15-28): cold 4.81 against 4.92 ms a segment, warm 3.58
against 3.88 (user 2.75 / system 0.83), the six copy workers 0.41-0.43 against 0.46-0.47 ms each warm, catch-up
46.6 against 49.2 s; the scan alone predicts ~0.05 ms a segment, so most of the warm gap is the load's noise
(``bench_copy_path`` A/B runs of the two trees, alternating, spread 4.7-7.2 ms a segment at load 15-24). Where a
burst's Python goes at faf1445 (``--profile-gil``, cold, 1,156 GIL samples, load 16-20; 4.57 ms a segment): the copy
runs 51% (the store's copy 14%, the metadata writes ~6%), the stage job 10%, discovery 6%, the
metadata consumer ~10%; by leaf, pathlib 14% (spread over some forty call sites in staging, the copier, the store
and the index readers, none above 1%), staging's own code 8%, the metadata cache 6%: no single cut left of a tenth.

Session 17 (h1; 2,000 partitions, 6,000 segments, side by side). Today at ea05c39 against 6960696 (session 16's
start; load 11-18): cold 3.85 against 4.02 ms a segment (user 2.80 / system 1.05), warm 3.15 against 3.51 (2.37 /
0.78), catch-up 49 / 35 s: the host ran at its usual speed for the first run of the night, then 1.2-1.5x slower,
most of it user time (2.80 -> 3.57-3.81 ms cold, system 1.05 -> 1.19: Python on a loaded machine). **This host's
price of an inode** moves the system time instead: its ext4 has no journal (``/sys/fs/ext4/vda/journal_task`` is
empty), and without one ``find_inode_bit`` skips every free inode of the group that was freed in the last
``dirty_expire`` (30 s), reading its inode table block to know it (``recently_deleted``). A new file costs 20-25 us
of CPU in a quiet group and 100-555 us where inodes were just freed (a microbench, same dir, minutes apart), and the
shared machine's test runs free thousands under /tmp, where the bench's work dir and the broker's log dirs are. The
sidecar makes two inodes a segment (the copy's data and index objects, the object format's two objects), three more
a partition in a cold burst (its staging and store dirs, its watermark file), the broker four a roll: a segment's
system time moves by up to 1 ms (two inodes at 100-555 us) with what other processes deleted in the last 30 s,
whatever the load (session 13's quiet run with 2.38 ms of system time). Each burst now reports it
(:func:`inode_cost_us`, before and after: 20-170 us in these runs). ``--perf`` of a cold burst (HEAD, load 22):
``__ext4_new_inode`` 4.8% of the sidecar's samples (``recently_deleted`` 3.8%), fsync 4.9%, futex 3.5%, openat 6.1%
in all, libpython ~60%, gc 1.9%. Where the Python goes (``--profile-gil``, cold, 3.65 ms a segment, load 5-13): the
copy runs 51% (the store's copy 17%, its data object's write with the batches' scan 8%; metadata writes 6.6%,
STARTED 3.4 and FINISHED 3.2; the run's and the fence's ListOffsets 5%; prepare 6.6%; the run's staging: stage_new
4.3%, release 2.9%, caught_up 1.3%; the watermark's first write 2.3%), the stage job 10.8%, the metadata consumer
13.9% (its cache apply 8.3%), discovery 6.2%, the bench's own /metrics scrapes 2.2%. By thread, cold / warm: the six
copy workers 0.44-0.46 / 0.38-0.39 ms each, the stage job 0.45 / 0.30, the metadata consumer 0.21, librdkafka 0.34 /
0.30. Tried and dropped: three copy workers instead of six (side by side, load 8-21): cold 5.70 against 5.57 ms,
warm 6.44 against 6.28, catch-up 70 against 52 s (fewer threads do not make the GIL hand-offs cheaper). The copy
watermark's first write made in place, not fsynced (ba7f772), against ea05c39, the two runs swapping which is
``--baseline`` (load 9-34): cold 5.01 against 5.18 ms and 4.64 against 4.76 (-0.12 to -0.17 ms, 2.5-3.3%: without a
journal an fsync of a new file syncs its parent dirs too), warm 4.15 against 4.09 and 4.45 against 4.39 (no first
write there: the noise).
What 3 ms needs, as measured: staging is 0.6-0.75 ms a segment (the stage job, the run's stage_new, release and the
caught-up listing); a copy run copying a segment straight from the log dir (its files held open) and staging only
what the next stage round still finds uncopied would save most of it, but leaves a rolled segment unstaged for one
stage interval more, in which local retention (or a retention lowered at runtime) can take it: a gap, the lead's
call, not taken here. The two store objects a segment cost ~40 us on a quiet or journaled file system.

Session 18 (h1; 2,000 partitions, 6,000 segments, every run side by side with ``--baseline`` at ec3a8f0, the
session's start, on one broker whose ``log.segment.delete.delay.ms`` is now Kafka's default, 60 s
(``--delete-delay-ms``; the suite's brokers run 1 s)). Rolled segments copied in place (:mod:`rlm.tasks.in_place`):
where a topic's ``file.delete.delay.ms`` is at least four stage intervals (here 60 s against 5 s), a copy run opens a
rolled segment's files in the log dir itself (read through ``/proc/self/fd``) instead of staging it, and the stage
job stages a segment only once retention renames it to ``.deleted`` or it waited half the delay; a shorter or unknown
delay stages at once, as before. Sidecar CPU per segment, this checkout against the baseline beside it:

    commit     load      cold               warm               stage job ms a segment, cold / warm     inode_cost_us
    63eee80    2.1-8.5   4.07 vs 4.48 ms    3.58 vs 4.01       0.540 vs 0.510 / 0.274 vs 0.387        18-43
    2b8339f    1.4-8.1   5.39 vs 6.54       4.58 vs 5.35       0.207 vs 0.761 / 0.240 vs 0.501        28-103
    2b8339f*   1.1-8.5   3.82 vs 4.67       3.62 vs 4.28       0.211 vs 0.617 / 0.182 vs 0.355        19-44
    b74c83c    2.4-6.8   2.93 vs 3.57       3.14 vs 4.10       0.096 vs 0.422 / 0.106 vs 0.366        17-31
    b74c83c    1.4-8.4   4.17 vs 5.17       4.25 vs 5.32       0.141 vs 0.595 / 0.127 vs 0.501        30-178
    f9d33e0    3.3-12.6  4.81 vs 5.31       3.83 vs 4.36       0.475 vs 0.730 / 0.158 vs 0.442        33-51
    f9d33e0    5.4-17.7  3.21 vs 3.73       3.28 vs 3.66       0.205 vs 0.471 / 0.187 vs 0.382        20-94
    f9d33e0*   10-38     4.40 vs 4.94       5.31 vs 5.51       0.461 vs 0.652 / 0.633 vs 0.614        19-129
    556fe45    1.6-11.5  3.75 vs 4.62       4.63 vs 5.12       0.153 vs 0.588 / 0.352 vs 0.478        28-44
    f35dcf6 †  2.8-14.4  5.36 vs 5.39       5.64 vs 5.58       0.640 vs 0.648 / 0.715 vs 0.675        26-37

(* this checkout's sidecar recorded by py-spy ``--gil``; † ``--delete-delay-ms 1000``: both stage at once, the
fallback costs what it did; f35dcf6 and f9d33e0 differ only while segments wait.) Since 2b8339f: -18 to -23% a
segment, cold and warm, in the runs whose burst caught up within ~30 s; -9 to -14% in the two loaded ones (catch-up
35-44 s, against 22-29 s), -11 / -4% in the most loaded (61-81 s; there the stage job's check of the staged
segments, ``Staging.holds``, was 7.1% of the GIL samples, the stage job 15.8%): a segment waits unstaged half the
delay at most (30 s here), and those that waited longer were staged by the stage job (0.475 ms a cold segment
there). What a run measures in absolute terms follows the hour (the broker's own CPU per segment in the same runs:
5.2-10.6 ms cold). f9d33e0 also reads the delay of topics with segments waiting at each cheap discovery round (0.002
DescribeConfigs calls a segment). At b74c83c's first run, cold 2.93 ms (user 2.17 / system 0.75), catch-up 21.7
against 24.5 s, peak RSS 138 against 135 MiB; the six copy workers 0.37-0.38 ms each against 0.41-0.42. The first
run's stage job listed every partition with a segment waiting at each round (2,000 listings every 5 s), which cost
what the staging it saved did; since 2b8339f it looks at such a partition only when its directory changed
(retention's rename is a change the watcher reports) or a segment waited long enough, and since b74c83c it does not
ask staging about a segment it knows waits. Where a cold burst goes now (2b8339f, GIL samples, 1,014): the copy runs
57% (the store's copy 21%, metadata writes 9.2%, the fence and the FINISHED write 6.6%, preparing 7.4%, opening in
place 1.5%, the clean-up's metadata listing 1.8%), the stage job 13.8% (``Staging.holds`` 4.9%, cut since), the
metadata consumer 8.7%, the runs' first ListOffsets 3.2%, discovery 2.8%: what is left of 3 ms is the store's copy
and the metadata topic's, outside the copier.

Session 19 (h3; 2,000 partitions, 6,000 segments, each run side by side with ``--baseline`` at 7b26f49, the session's
start; the lead's quiet run of 7b26f49 alone that morning: cold 4.03, warm 4.00 ms, load 0.9-4.3). Cut: a copy run's
start asks the cluster for up to 64 copy jobs waiting behind it too, and those runs start from that answer (at most
5 s old; the fence after each batch asks anew), and the ListOffsets of copy runs linger 3 ms while requests follow
each other (56276d0: 0.24-0.33 ListOffsets a segment against 0.55-0.78, the admin client's thread 0.09-0.11 ms a
cold segment against 0.12-0.19); staging's root of a partition dir without resolving its path (84d7bfa: 2.5% of a cold
burst's GIL samples, in the stage job); a copy's data object in two writes, not one per section (eed9f1d); the
sections of a segment copied in place read by pread on the files it holds, not opened again through /proc/self/fd
(0744bcb). Sidecar CPU per segment, this checkout against 7b26f49 beside it:

    commit     load      cold               warm               catch-up (cold)
    56276d0*   2.6-9.8   3.12 vs 3.34 ms    2.62 vs 2.75       36.2 vs 35.7 s
    84d7bfa    3.2-10.9  3.02 vs 3.15       2.56 vs 2.72       26.5 vs 26.2 s
    eed9f1d    3.3-8.3   2.90 vs 3.12       3.36 vs 3.61       21.5 vs 23.2 s
    0744bcb    4.1-7.7   3.98 vs 4.34       3.17 vs 3.39       27.0 vs 28.6 s
    0744bcb    3.4-7.9   4.35 vs 4.70       3.69 vs 3.96       25.9 vs 27.5 s   (inode_cost_us 159-264)

(* its ListOffsets linger then also on the expiration job's asks, which no burst saw.) -4 to -8% a segment, cold and
warm: not the fifth asked for. 500 partitions (1,500 segments, one run each, load 2.2-3.9): the prefetch alone 3.75
vs 4.15 ms (0.46 vs 0.89 ListOffsets a segment), the linger beside it against without 3.39 vs 3.57 (0.32 vs 0.50).
Tried and dropped, side by side at 2,000 against the same code without: the metadata writes' group commit lingering
5 ms instead of 2 (load 4.7-14.4): 3.28 vs 3.28 ms, the consumer thread 0.24 both; ``sys.setswitchinterval(0.02)``
(load 9-28): 4.29 vs 4.28 ms. Where it goes (0744bcb alone, ``--profile-gil`` at 200 Hz, 3,360 samples, load
1.7-4.9): copy runs 70% (the store's copy 17%, the FINISHED write and its fence 10%, the STARTED write 6%, preparing
6%, staging the run 5%, the run's start 4.5%, the clean-up's metadata listing 3.6%, making the batch durable 2.5%),
the metadata consumer 11%, the stage job 3.6%, discovery 2.8%. Copy runs a segment may decide more of the figure than
any cut above: alone, caught up within 14 s, that run made 0.86 runs a segment (5.06 ms a segment, py-spy attached);
beside a baseline, 0.43-0.54 (each run copies more rolls, as the two sidecars slow each other). A run's own work (its
start, the clean-up's metadata listing, staging, the watermark, the caught-up check, a batch's two metadata writes,
fence and directory fsync) is spent once however many segments it copies: not measured apart yet.

Session 20 (h1; 2,000 partitions, 6,000 segments). Alone on a quiet machine the sidecar keeps up with the burst, so
each roll gets a copy run of its own: 0.76-0.79 runs a cold segment alone, 0.42-0.51 beside a baseline (the two
sidecars' backlog gathers a partition's rolls), and alone is where the figure is asked. A run's own work, measured
apart: ``bench_copy_path`` (staging path, no Kafka, load 1.6-1.8) 2.78 / 2.90 ms a segment at one segment a run,
2.01 / 2.25 at three: ~1 ms a run before its metadata writes, fence and ListOffsets; in the burst (91fa404 alone,
``--profile-gil`` at 200 Hz, 1,721 samples, load 1.3-3.5) about half the copy workers' samples are a run's or a
batch's, not a segment's: the copy runs 70% (the store's copy 25%, the FINISHED write and its fence 11%, prepare 7%,
the STARTED write 4%, stage_new 4%, the run's start 3%, the caught-up check 2%, the clean-up's listing 1.5%), the
metadata consumer 11%, the stage job 5%. Cut: a segment copied in place is read on the descriptors the copy holds
(fff1cb2, :mod:`rsm.log.held`: the ledger writer and the CRC scan each opened its ``.log`` through ``/proc/self/fd``,
the time index was read through ``Path.read_bytes``; index files and the leader-epoch checkpoint by ``os.open`` and
``os.read``): a one-segment copy run in place 72 -> 56 system calls (``strace -f``, a crafted partition); side by
side with 91fa404, swapping which is the baseline (load 1.1-6.1): cold 2.15 vs 2.25 and 2.44 vs 2.49 ms, warm 2.31
vs 2.35 and 2.48 vs 2.54. Copy jobs settle (0b6863d, ``tasks.copy_settle_ms``, 5 s): a woken job runs 5 s after the
wake, and the rolls of the next produce round come with it. Alone, alternating runs:

    run                      load      cold ms (copy runs a seg)  warm ms (runs)   catch-up cold / warm
    fff1cb2 (no settle)      0.9-3.7   4.09 (0.781)               3.36 (0.539)     10.4 / 13.5 s
    91fa404                  0.5-3.8   3.88 (0.793)               2.91 (0.580)      9.4 / 12.0
    settle 5 s               0.8-2.1   2.95 (0.471)               2.62 (0.428)     13.3 / 14.2
    fff1cb2 (no settle)      0.7-3.9   3.28 (0.761)               4.35 (0.513)      8.1 / 21.7
    settle 5 s               1.0-2.7   3.22 (0.547)               3.19 (0.440)     11.6 / 14.8
    0b6863d (5 s, default)   0.8-2.2   2.42 (0.423)               2.52 (0.434)     13.3 / 13.4
    0b6863d, settle 0        0.6-3.0   3.55 (0.792)               3.31 (0.549)     10.3 / 13.5

The last run of 0b6863d as it ships (quiet, new inodes at 17-25 us): cold 2.42 ms a segment (user 1.76 / system 0.66),
warm 2.52, peak RSS 137 / 148 MiB, idle 1.5% of a core at 5 s intervals. With the settle, alone: cold 2.42-3.22 ms,
warm 2.52-3.19 (3 ms met in two runs of three; the third began with new inodes at 242 us); without it 3.28-4.09 cold,
2.91-4.35 warm. The settle's cost is the lag: catch-up +1 to +5 s cold.
System calls a segment in a 500-partition burst (``strace -f -c``, 91fa404; strace's slowing inflates the futex
count): futex 405, openat 17.5, close 15.7, newfstatat 13.1, recvmsg 12.2, read 8.0, getdents64 5.7, lseek 5.3, pread
5.0, fsync 3.0, writev 3.0. Tried and dropped: ``copy_coalesce_ms`` 6 s against 2 s, side by side (load 0.7-5.4):
2.46 vs 2.45 ms, 0.495 vs 0.489 runs a segment; a 2 s settle side by side with the same code without (load 0.6-5.4):
cold 2.96 vs 3.14 ms, warm 2.29 vs 2.33, 0.580 vs 0.631 and 0.421 vs 0.426 runs a segment (beside a baseline the
backlog gathers rolls already). Not done: the caught-up check's second listing of the directory (five system calls a
run: the sleep's safety net), the partition's metadata decoded at every run's clean-up (its cost grows with the
partition's remote segments; a per-partition version in the cache would let a run reuse the last listing).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.procstat import thread_times  # noqa: E402

KiB = 1024
MiB = 1024 * KiB
SEGMENT_BYTES = 64 * KiB  # what each partition gets per burst round: one segment each
SEGMENT_MS = 1500  # the topics' segment.ms (segment.bytes cannot go below 1 MiB): a round rolls the previous one
VALUE_BYTES = 1000
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------------------- the child process
def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (every thread)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


HOOKS = Path(__file__).resolve().parent / "sidecar_hooks.py"  # run in the sidecar child first: its docstring says what


def job_cpu(path: Path) -> dict[str, float]:
    """CPU seconds of each apscheduler job's runs so far in a sidecar child (``bench/sidecar_hooks.py`` writes them
    every second): discovery, stage, gauges, expiration, gc."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def cluster_calls(port: int) -> dict[str, float]:
    """The sidecar's admin calls to the cluster so far (``rlm_cluster_calls`` by call, and ``partitions``: the
    partitions its list_offsets calls asked for) and its copy runs (``copy_runs``), from one scrape of /metrics;
    empty for a checkout without them."""
    out: dict[str, float] = {}
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    for m in re.finditer(r'^rlm_cluster_calls_total\{call="(\w+)"\} (\S+)$', text, re.M):
        out[m.group(1)] = float(m.group(2))
    m = re.search(r"^rlm_list_offsets_partitions_total (\S+)$", text, re.M)
    if m:
        out["partitions"] = float(m.group(1))
    m = re.search(r"^rlm_copy_run_segments_count (\S+)$", text, re.M)
    if m:
        out["copy_runs"] = float(m.group(1))  # (not a call: the copy runs of segment mode, rlm_copy_run_segments)
    m = re.search(r'^rlm_copy_run_segments_bucket\{le="0\.0"\} (\S+)$', text, re.M)
    if m:
        out["empty_runs"] = float(m.group(1))  # (copy runs that copied nothing)
    return out


def cpu_split(pid: int) -> dict[str, float]:
    """CPU seconds of ``pid`` so far: ``user`` and ``system`` (every thread, ended ones too), its minor page faults
    (``minflt``, in thousands), and the CPU seconds of its live threads by group: ``librdkafka`` (threads named
    ``rdk:*``: the metadata topic's producer and consumer, the cluster view's clients) and ``python`` (the rest: copy
    workers, the metadata consumer task, the scheduler)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    out = {"user": int(fields[11]) / CLK_TCK, "system": int(fields[12]) / CLK_TCK, "librdkafka": 0.0, "python": 0.0,
           "minflt": int(fields[7]) / 1000}  # minor page faults, in thousands (x 1000 ms below: per segment)
    for (_, comm), cpu in thread_cpu(pid).items():
        out["librdkafka" if comm.startswith("rdk:") else "python"] += cpu
    return out


def thread_cpu(pid: int) -> dict[tuple[int, str], float]:
    """CPU seconds of each live thread of ``pid``, keyed by (thread id, name). Python 3.11 names no thread of its own
    (every Python thread is ``python``: the copy workers, the metadata consumer task, the scheduler, told apart only
    by their ids); librdkafka's are ``rdk:main``, ``rdk:broker<n>``, ..."""
    return {key: user + system for key, (user, system) in thread_times(pid).items()}


def rss_mib(pid: int, key: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Sampler(threading.Thread):
    """Peak RSS of a process, sampled every 200 ms while running."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0.0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(0.2):
            try:
                self.peak = max(self.peak, rss_mib(self.pid))
            except (FileNotFoundError, ProcessLookupError):
                return

    def stop(self) -> float:
        self._done.set()
        self.join()
        return self.peak


def health(port: int) -> dict:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as err:  # 503 while not ready: the body says the same
        return json.loads(err.read())


def wait_until(cond, timeout_s: float, what: str, interval_s: float = 0.5):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout_s
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


class SidecarProcess:
    """``rlm serve`` in a child process, its config written as YAML."""

    def __init__(self, kc, work: Path, name: str, *, copy_ms: int, discovery_ms: int,  # noqa: ANN001
                 topic_prefix: str, root: Path = ROOT) -> None:
        import yaml

        from devtools.devkafka import free_port

        self.port = free_port()
        self.dir = work / name
        self.dir.mkdir()
        cfg = {
            "broker_id": 1,
            "log_dirs": [str(d) for d in kc.node(1).log_dirs],
            "staging_dir": str(self.dir / "staging"),
            "kafka": {"bootstrap_servers": kc.bootstrap_servers},
            "store": {"store": "fs", "root_path": str(self.dir / "remote"), "fsync": STORE_FSYNC},
            "metadata": {"topic": f"__rlm_md_{name}", "partitions": 10, "replication_factor": 1,
                         "state_dir": str(self.dir / "state"), "to_be_deleted_topic": f"__rlm_tbd_{name}"},
            "tasks": {"copy_interval_ms": copy_ms, "discovery_interval_ms": discovery_ms,
                      **({"copy_workers": COPY_WORKERS} if COPY_WORKERS and root == ROOT else {}),
                      **({"copy_coalesce_ms": COPY_COALESCE_MS} if COPY_COALESCE_MS is not None and root == ROOT
                         else {}),
                      **({"copy_settle_ms": COPY_SETTLE_MS} if COPY_SETTLE_MS is not None and root == ROOT else {})},
            "topics": {"include": [f"{re.escape(topic_prefix)}.*"]},
            "retention": [{"pattern": ".*", "retention_ms": -1, "retention_bytes": -1}],
            "listen": {"host": "127.0.0.1", "port": self.port},
            "log_format": "text",
            "log_level": "WARNING",
        }
        path = self.dir / "sidecar.yaml"
        path.write_text(yaml.safe_dump(cfg))
        self.log = open(self.dir / "sidecar.log", "wb")  # noqa: SIM115 - closed in stop()
        self.job_cpu_path = self.dir / "job-cpu.json"
        env = {**os.environ, "PYTHONPATH": str(root),  # this checkout's rlm, or --baseline's
               "RLM_BENCH_JOB_CPU": str(self.job_cpu_path)}
        self.proc = subprocess.Popen([sys.executable, "-c", f"exec(open({str(HOOKS)!r}).read()); import sys; "
                                      "from rlm.cli import main; sys.exit(main())",
                                      "serve", "--config", str(path)],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=root)
        self.pid = self.proc.pid

    def leading(self) -> int:
        try:
            return int(health(self.port).get("leading", 0))
        except OSError:
            return 0

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


# -------------------------------------------------------------------------------------------------------- phases
def create_topics(kc, prefix: str, topics: int, partitions: int, extra: dict[str, str] | None = None,  # noqa: ANN001
                  ) -> list[str]:
    names = [f"{prefix}{i:03d}" for i in range(topics)]
    per = partitions // topics
    cfg = {"segment.ms": str(SEGMENT_MS), "retention.ms": "-1", "retention.bytes": "-1",
           "segment.index.bytes": str(64 * KiB), **(extra or {})}
    for name in names:
        kc.create_topic(name, per, config=cfg, timeout=120)
    return names


STORE_FSYNC = True  # --store-no-fsync: the store's fsyncs off (staging's stay); LocalTieredStorage has none
COPY_WORKERS = 0  # --copy-workers: tasks.copy_workers of this checkout's sidecar (0: the default)
COPY_COALESCE_MS: int | None = None  # --copy-coalesce-ms: tasks.copy_coalesce_ms of this checkout's (None: default)
COPY_SETTLE_MS: int | None = None  # --copy-settle-ms: tasks.copy_settle_ms of this checkout's (None: default)
PROFILE_GIL = False  # --profile-gil: sample only the thread holding the GIL (Python's CPU, not threads waiting)
PROFILE_RATE = 50  # --profile-rate: py-spy's samples a second


def profile(pid: int, seconds: float | None, out: Path) -> subprocess.Popen:
    """py-spy on ``pid`` for ``seconds`` (None: until sent SIGINT), raw collapsed stacks into ``out``. Without
    ``--gil``, py-spy counts a thread as on CPU when it is not in a known idle wait: a thread blocked in fsync, in
    librdkafka's flush or runnable behind the GIL on a loaded machine is counted, so shares are of wall time more than
    of CPU; with ``PROFILE_GIL`` only the thread holding the GIL is sampled (Python's CPU, not the kernel's work in
    system calls made without the GIL, nor librdkafka's threads)."""
    duration = ["--duration", str(int(seconds))] if seconds is not None else []
    if PROFILE_GIL:
        duration.append("--gil")
    spy = Path(sys.executable).parent / "py-spy"  # installed in the venv
    return subprocess.Popen([str(spy), "record", "--pid", str(pid), *duration, "--rate", str(PROFILE_RATE),
                             "--format", "raw", "--output", str(out), "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def top_functions(collapsed: Path, n: int = 15) -> list[tuple[str, float]]:
    """The functions most on CPU (self + children, inclusive), as a share of all samples: from py-spy's raw format."""
    inclusive: Counter[str] = Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        c = int(count)
        total += c
        for frame in set(stack.split(";")):
            if "rlm/" in frame or "rsm/" in frame or "rlmm/" in frame or "apscheduler" in frame:
                inclusive[f"{frame.split(' (')[0]} ({frame.rsplit('/', 1)[-1].split(':')[0]})"] += c
    return [(f, c / max(1, total)) for f, c in inclusive.most_common(n)]


def perf_record(pid: int, out: Path) -> subprocess.Popen:
    """``perf record -g`` of ``pid`` (every thread, kernel and user space, 499 Hz) into ``out`` until sent SIGINT:
    what py-spy does not see, the kernel's share (futex hand-offs, fsyncs, inode work) and librdkafka's threads."""
    return subprocess.Popen(["perf", "record", "-F", "499", "-g", "-p", str(pid), "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def perf_summary(data: Path, n: int = 25) -> list[str]:
    """The lines of ``perf report`` of ``data``: the share of samples by thread name and object (kernel, python,
    librdkafka, ...), then the symbols most sampled (self time)."""
    def report(sort: str) -> list[str]:
        out = subprocess.run(["perf", "report", "--stdio", "--no-children", "-g", "none", "--percent-limit", "0.5",
                              "--sort", sort, "-i", str(data)], capture_output=True, text=True, check=False).stdout
        return [line for line in out.splitlines() if line.strip() and not line.startswith("#")][:n]
    return [*report("comm,dso"), "", *report("sym")]


def broker_pid(kc) -> int:  # noqa: ANN001
    """The broker's JVM (``devtools.devkafka`` runs ``java`` itself, no wrapper script)."""
    return kc.node(1).process.pid


def settle(pid: int, window_s: float = 5.0, timeout_s: float = 60.0) -> float:
    """Wait until ``pid``'s CPU over a window of ``window_s`` is within a quarter (or 0.5 points of a core) of the
    window before it, at most ``timeout_s``: the first copy runs of thousands of partitions are over. Returns the
    seconds waited."""
    t0 = time.monotonic()
    last = None
    while time.monotonic() - t0 < timeout_s:
        c0 = cpu_s(pid)
        time.sleep(window_s)
        pct = 100 * (cpu_s(pid) - c0) / window_s
        if last is not None and abs(pct - last) <= max(0.5, 0.25 * last):
            break
        last = pct
    return time.monotonic() - t0


def idle_phase(kc, work: Path, name: str, n_partitions: int, prefix: str, *, copy_ms: int,  # noqa: ANN001
               discovery_ms: int, idle_s: float, profile_dir: Path | None, baseline: Path | None = None) -> dict:
    sc = SidecarProcess(kc, work, name, copy_ms=copy_ms, discovery_ms=discovery_ms, topic_prefix=prefix)
    base = None
    try:
        if baseline is not None:
            base = SidecarProcess(kc, work, f"{name}-baseline", copy_ms=copy_ms, discovery_ms=discovery_ms,
                                  topic_prefix=prefix, root=baseline)
        t0 = time.monotonic()
        wait_until(lambda: sc.leading() >= n_partitions, 300, f"the sidecar to lead {n_partitions} partitions")
        lead_s = time.monotonic() - t0
        if base is not None:
            wait_until(lambda: base.leading() >= n_partitions, 300, "the baseline sidecar to lead them")
        # let every first copy run (and the first rounds of every job) pass: one copy interval and a bit, then until
        # the sidecar's CPU settles (4,000 first runs on a loaded machine outlast that interval)
        time.sleep(copy_ms / 1000 + 5)
        settle_s = settle(sc.pid)
        spy = profile(sc.pid, idle_s, profile_dir / f"idle-{name}.txt") if profile_dir else None
        bpid = broker_pid(kc)
        c0, b0, w0 = cpu_s(sc.pid), cpu_s(bpid), time.monotonic()
        x0 = cpu_s(base.pid) if base is not None else 0.0
        time.sleep(idle_s)
        c1, b1, w1 = cpu_s(sc.pid), cpu_s(bpid), time.monotonic()
        rss = rss_mib(sc.pid)
        if spy is not None:
            spy.wait(idle_s + 60)
        out = {"cpu_pct": 100 * (c1 - c0) / (w1 - w0), "rss_mib": rss, "lead_s": lead_s, "settle_s": settle_s,
               "sidecar": sc,
               "load": os.getloadavg()[0], "broker_cpu_pct": 100 * (b1 - b0) / (w1 - w0)}
        if base is not None:
            out["baseline"] = {"sidecar": base, "cpu_pct": 100 * (cpu_s(base.pid) - x0) / (w1 - w0),
                               "rss_mib": rss_mib(base.pid)}
        return out
    except BaseException:
        sc.stop()
        if base is not None:
            base.stop()
        raise


def produce_burst(bootstrap: str, topics: list[str], per_topic: int, rounds: int, *, close: bool = True,
                  after_earlier: bool = False) -> int:
    """``rounds`` rounds of about 64 KiB to every partition, then one record each (``close``): each round's first
    append rolls the segment the previous round filled (``segment.ms`` passed), so every partition rolls ``rounds``
    segments. Partition by partition, so that a partition's round is one batch (no roll inside a round). Without
    ``close`` the last round's segment stays active (so ``rounds - 1`` roll); ``after_earlier``: a burst without
    ``close`` came before, its last segment rolled by this one's first round (one more segment rolls, 64 KiB too)."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 128 * KiB,
                  "compression.type": "none", "queue.buffering.max.kbytes": 512 * 1024, "acks": "1"})
    value = os.urandom(VALUE_BYTES)
    n = 0
    for r in range(rounds + 1 if close else rounds):
        if r or after_earlier:
            time.sleep(SEGMENT_MS / 1000 + 0.2)
        for t in topics:
            for part in range(per_topic):
                for _ in range(SEGMENT_BYTES // (VALUE_BYTES + 70) if r < rounds else 1):
                    while True:
                        try:
                            p.produce(t, value, partition=part)
                            break
                        except BufferError:
                            p.poll(0.05)
                    n += 1
            p.poll(0)
        if p.flush(300):
            raise RuntimeError("burst: records left undelivered")
    return n


def rolled_segments(log_dir: Path, prefix: str) -> int:
    n = 0
    for d in log_dir.iterdir():
        if d.name.startswith(prefix) and d.is_dir():
            n += max(0, len(list(d.glob("*.log"))) - 1)
    return n


def inode_cost_us(where: Path, n: int = 200) -> float:
    """CPU microseconds (this thread's) to make one empty file in a new directory under ``where``: the host's price of
    an inode where the sidecar makes its store objects (two a segment). On this machine's ext4, which has no journal,
    ``find_inode_bit`` skips every free inode of the group that was freed in the last ``dirty_expire`` (~30 s) and
    reads its inode table block to see so (``recently_deleted``): ~20 us a file in a quiet group, 100-550 us where
    other processes (the shared machine's test runs under /tmp) just deleted many, which moves a segment's CPU by
    0.2-1 ms from run to run. The files stay (deleting them would tax the inodes made after them) until the work dir
    goes."""
    d = Path(tempfile.mkdtemp(prefix=".inode-probe-", dir=where))
    t0 = time.thread_time()
    for i in range(n):
        os.close(os.open(d / f"f{i}", os.O_WRONLY | os.O_CREAT, 0o644))
    return 1e6 * (time.thread_time() - t0) / n


def burst_phase(kc, sc: SidecarProcess, topics: list[str], per_topic: int, prefix: str,  # noqa: ANN001
                segments_per_partition: int, idle_cpu_pct: float, profile_dir: Path | None,
                baseline: SidecarProcess | None = None, *, warm: bool = False, leave_open: bool = False,
                perf_dir: Path | None = None) -> dict:
    """The burst, measured on ``sc`` (and on ``baseline``, a sidecar of another checkout copying the same segments
    beside it, until it caught up in turn: ``out["baseline"]``): every partition rolls ``segments_per_partition``
    segments of 64 KiB. ``leave_open``: the last segment is left active and full (a 64 KiB round instead of the one
    closing record), for a ``warm`` burst after this one, whose first round rolls it. A warm burst is one after the
    sidecars copied the segments of an earlier one: a partition's first copy sets up what later ones reuse (the
    store's and staging's directories, the copy watermark file), which the cold burst counts and a warm one not.
    ``perf_dir``: ``perf record`` of ``sc`` over the burst into ``perf_dir/burst.perf.data`` (:func:`perf_record`)."""

    def copied(s: SidecarProcess) -> int:
        # the store's index objects (a copy's commit point), counted by this process: scraping the sidecar's /metrics
        # (thousands of labelled series) every second cost it about a tenth of its CPU in the burst
        return sum(1 for _ in (s.dir / "remote").rglob("*-index"))

    earlier_rolled = rolled_segments(kc.log_dir(), prefix)
    peak = Sampler(sc.pid)
    peak.start()
    base_peak = Sampler(baseline.pid) if baseline is not None else None
    if base_peak is not None:
        base_peak.start()
    spy = profile(sc.pid, None, profile_dir / "burst.txt") if profile_dir else None
    perf = perf_record(sc.pid, perf_dir / "burst.perf.data") if perf_dir else None
    load0 = os.getloadavg()[0]
    inode0 = inode_cost_us(sc.dir)
    bpid = broker_pid(kc)
    b0 = cpu_s(bpid)
    x0 = cpu_s(baseline.pid) if baseline is not None else 0.0
    # the baseline's threads and jobs at the start, to split its CPU as this checkout's (when it caught up)
    xthreads0 = thread_cpu(baseline.pid) if baseline is not None else {}
    xjobs0 = job_cpu(baseline.job_cpu_path) if baseline is not None else {}
    xcalls0 = cluster_calls(baseline.port) if baseline is not None else {}
    calls0, jobs0 = cluster_calls(sc.port), job_cpu(sc.job_cpu_path)
    c0, w0, split0, threads0 = cpu_s(sc.pid), time.monotonic(), cpu_split(sc.pid), thread_cpu(sc.pid)
    rounds = segments_per_partition - (1 if warm else 0) + (1 if leave_open else 0)
    n_records = produce_burst(kc.bootstrap_servers, topics, per_topic, rounds, close=not leave_open,
                              after_earlier=warm)
    produced = time.monotonic()
    total_rolled = rolled_segments(kc.log_dir(), prefix)
    rolled = total_rolled - earlier_rolled  # this burst's own

    def caught_up(s: SidecarProcess) -> bool:
        return copied(s) >= total_rolled

    base_done: tuple[float, float] | None = None  # (its CPU seconds, the time) when the baseline caught up
    base_split: dict = {}  # its threads' and jobs' CPU then

    def both() -> bool:
        nonlocal base_done
        if baseline is not None and base_done is None and caught_up(baseline):
            base_done = (cpu_s(baseline.pid), time.monotonic())
            base_split.update(threads=thread_cpu(baseline.pid), jobs=job_cpu(baseline.job_cpu_path),
                              calls=cluster_calls(baseline.port))
        return caught_up(sc)

    wait_until(both, 1800, f"the sidecar to copy {rolled} rolled segments", 1.0)
    c1, w1, split1, threads1 = cpu_s(sc.pid), time.monotonic(), cpu_split(sc.pid), thread_cpu(sc.pid)
    calls1 = cluster_calls(sc.port)
    time.sleep(1.2)  # the hooks' next write: every job run so far
    jobs1 = job_cpu(sc.job_cpu_path)
    b1 = cpu_s(bpid)
    if baseline is not None:
        wait_until(lambda: both() and base_done is not None, 1800, "the baseline sidecar to copy them", 1.0)
    for p in (spy, perf):
        if p is not None:
            p.send_signal(signal.SIGINT)
            p.wait(120)
    cpu = (c1 - c0) - idle_cpu_pct / 100 * (w1 - w0)
    inodes_us = (inode0, inode_cost_us(sc.dir))
    return {"records": n_records, "inode_us": inodes_us, "segments": rolled, "cpu_s": c1 - c0, "net_cpu_s": cpu,
            "ms_per_segment": 1000 * cpu / max(1, rolled), "gross_ms_per_segment": 1000 * (c1 - c0) / max(1, rolled),
            "catch_up_s": w1 - produced, "total_s": w1 - w0, "peak_rss_mib": peak.stop(),
            "produce_s": produced - w0, "load": (load0, os.getloadavg()[0]), "broker_cpu_s": b1 - b0,
            "split_ms_per_segment": {k: 1000 * (split1[k] - split0[k]) / max(1, rolled) for k in split0},
            "threads_ms_per_segment": _per_segment_threads(threads1, threads0, rolled),
            "calls_per_segment": {k: (v - calls0.get(k, 0.0)) / max(1, rolled) for k, v in calls1.items()},
            "jobs_ms_per_segment": {k: 1000 * (v - jobs0.get(k, 0.0)) / max(1, rolled) for k, v in jobs1.items()},
            "warm": warm,
            **({"baseline": {"cpu_s": base_done[0] - x0, "catch_up_s": base_done[1] - produced,
                             "threads_ms_per_segment": _per_segment_threads(base_split["threads"], xthreads0, rolled),
                             "jobs_ms_per_segment": {k: 1000 * (v - xjobs0.get(k, 0.0)) / max(1, rolled)
                                                     for k, v in base_split["jobs"].items()},
                             "calls_per_segment": {k: (v - xcalls0.get(k, 0.0)) / max(1, rolled)
                                                   for k, v in base_split["calls"].items()},
                             "peak_rss_mib": base_peak.stop() if base_peak is not None else 0.0}}
               if base_done is not None else {})}


def _per_segment_threads(after: dict[tuple[int, str], float], before: dict[tuple[int, str], float],
                         segments: int) -> list[tuple[str, float]]:
    """Each thread's CPU between two :func:`thread_cpu` snapshots, in ms per segment, the busiest first."""
    by_thread = sorted(((k, v - before.get(k, 0.0)) for k, v in after.items()), key=lambda kv: -kv[1])
    return [(f"{comm}/{tid}", 1000 * v / max(1, segments)) for (tid, comm), v in by_thread]


def kafka_tiered_phase(broker_cfg: dict[str, str], work: Path, prefix: str, n_topics: int, n_partitions: int,
                       rounds: int, idle_s: float, task_interval_ms: int) -> dict:
    """The same burst against Kafka's own tiered storage: a broker of its own (the same settings, plus
    :func:`bench.kafka_tiered.kafka_tiered_storage_config`: ``LocalTieredStorage``, Kafka's topic-based metadata
    manager, the RLM task interval ``task_interval_ms``), the same topics with ``remote.storage.enable``. Its CPU
    (the JVM's, every thread) idle over ``idle_s`` once every partition's RLM task runs, then from the first record
    produced until ``LocalTieredStorage`` holds every rolled segment complete."""
    from bench.kafka_tiered import kafka_remote_segments, kafka_tiered_storage_config
    from devtools.devkafka import KafkaCluster

    remote = work / "kafka-remote"
    remote.mkdir()
    cfg = {**kafka_tiered_storage_config(remote, task_interval_ms), **broker_cfg}
    with KafkaCluster(brokers=1, broker_config=cfg, heap="2g") as kc:
        topics = create_topics(kc, prefix, n_topics, n_partitions, {"remote.storage.enable": "true"})
        pid = broker_pid(kc)
        time.sleep(task_interval_ms / 1000 + 20)  # every partition's RLM task scheduled, its first runs done
        c0, w0 = cpu_s(pid), time.monotonic()
        time.sleep(idle_s)
        idle_pct = 100 * (cpu_s(pid) - c0) / (time.monotonic() - w0)
        rss_idle = rss_mib(pid)
        peak = Sampler(pid)
        peak.start()
        load0 = os.getloadavg()[0]
        c0, w0 = cpu_s(pid), time.monotonic()
        n_records = produce_burst(kc.bootstrap_servers, topics, n_partitions // n_topics, rounds)
        produced = time.monotonic()
        rolled = rolled_segments(kc.log_dir(), prefix)
        wait_until(lambda: kafka_remote_segments(remote) >= rolled, 1800,
                   f"Kafka's RLM to copy {rolled} rolled segments", 2.0)
        c1, w1 = cpu_s(pid), time.monotonic()
        return {"records": n_records, "segments": rolled, "cpu_s": c1 - c0,
                "net_cpu_s": (c1 - c0) - idle_pct / 100 * (w1 - w0), "idle_cpu_pct": idle_pct,
                "catch_up_s": w1 - produced, "total_s": w1 - w0, "produce_s": produced - w0,
                "peak_rss_mib": peak.stop(), "idle_rss_mib": rss_idle, "load": (load0, os.getloadavg()[0])}


def side_by_side(b: dict, idle: dict, k: dict, interval_ms: int) -> list[tuple[str, str, str]]:
    """Rows of the sidecar's burst (``b``, its idle phase ``idle``) beside Kafka's RLM's (``k``): CPU per rolled
    segment of each process, gross (from the first record produced to the last segment copied) and net of its idle
    rate over that time. The broker's CPU in the sidecar's run is the produce's and its answers to the sidecar (the
    metadata topic, ListOffsets); in Kafka's run, the produce's and its RLM's (copies, the metadata topic): the
    tiering's cost compares as the sum of both processes in the sidecar's run against the broker's alone."""
    def ms(cpu_s: float, n: int) -> str:
        return f"{1000 * cpu_s / max(1, n):.2f} ms"

    n, kn = b["segments"], k["segments"]
    b_idle = idle["broker_cpu_pct"] / 100 * b["total_s"]
    sc_idle = idle["cpu_pct"] / 100 * b["total_s"]
    k_idle = k["idle_cpu_pct"] / 100 * k["total_s"]
    return [
        ("rolled segments (64 KiB)", f"{n:,}", f"{kn:,}"),
        (f"idle CPU, broker (copy / RLM task interval {interval_ms / 1000:.0f} s)",
         f"{idle['broker_cpu_pct']:.1f}%", f"{k['idle_cpu_pct']:.1f}%"),
        ("idle CPU, sidecar", f"{idle['cpu_pct']:.1f}%", "-"),
        ("burst CPU per segment, sidecar", ms(b["cpu_s"], n), "-"),
        ("burst CPU per segment, broker", ms(b["broker_cpu_s"], n), ms(k["cpu_s"], kn)),
        ("burst CPU per segment, broker + sidecar", ms(b["cpu_s"] + b["broker_cpu_s"], n), ms(k["cpu_s"], kn)),
        ("the same, net of each one's idle CPU", ms(b["cpu_s"] + b["broker_cpu_s"] - b_idle - sc_idle, n),
         ms(k["cpu_s"] - k_idle, kn)),
        ("catch-up after the last record acked", f"{b['catch_up_s']:.1f} s", f"{k['catch_up_s']:.1f} s"),
        ("first record to last segment copied", f"{b['total_s']:.1f} s", f"{k['total_s']:.1f} s"),
        ("peak RSS of the tiering process", f"{b['peak_rss_mib']:.0f} MiB (sidecar)",
         f"{k['peak_rss_mib']:.0f} MiB (broker, 2 GiB heap; {k['idle_rss_mib']:.0f} idle)"),
        ("machine load, start / end", f"{b['load'][0]:.1f} / {b['load'][1]:.1f}",
         f"{k['load'][0]:.1f} / {k['load'][1]:.1f}"),
    ]


def burst_rows(b: dict, tag: str) -> list[tuple[str, str]]:
    """The report's rows of one burst (:func:`burst_phase`'s result), each named starting with ``tag``."""
    sp = b["split_ms_per_segment"]
    rows = [
        ("rolled segments (64 KiB)", f"{b['segments']:,} ({b['records']:,} records, produced in "
         f"{b['produce_s']:.1f} s; {'warm: after the burst before' if b['warm'] else 'cold'})"),
        ("sidecar CPU per rolled segment", f"{b['gross_ms_per_segment']:.2f} ms ({b['cpu_s']:.1f} CPU s from the "
         "first record produced to the last segment copied)"),
        ("the same, net of idle CPU over that time", f"{b['ms_per_segment']:.2f} ms ({b['net_cpu_s']:.1f} CPU s)"),
        ("the same, user / system", f"{sp['user']:.2f} / {sp['system']:.2f} ms"),
        ("the same, python / librdkafka threads (live ones)", f"{sp['python']:.2f} / {sp['librdkafka']:.2f} ms"),
        ("the busiest threads, ms per rolled segment",
         ", ".join(f"{name} {ms:.2f}" for name, ms in b["threads_ms_per_segment"][:12])),
        ("apscheduler's jobs (their pool threads), ms per rolled segment", ", ".join(
            f"{k} {v:.3f}" for k, v in sorted(b["jobs_ms_per_segment"].items(), key=lambda kv: -kv[1]))),
        ("admin calls to the cluster (and copy_runs, empty_runs: copy runs, those that copied nothing) per rolled "
         "segment", ", ".join(
            f"{k} {v:.3f}" for k, v in sorted(b["calls_per_segment"].items())) or "(not counted by this checkout)"),
        ("minor page faults per rolled segment", f"{sp['minflt']:.0f}"),
        ("catch-up after the last record acked", f"{b['catch_up_s']:.1f} s"),
        ("peak RSS", f"{b['peak_rss_mib']:.0f} MiB"),
        ("machine load average, start / end", f"{b['load'][0]:.1f} / {b['load'][1]:.1f}"),
        ("host: CPU of a new inode by the sidecar's files, start / end (inode_cost_us)",
         f"{b['inode_us'][0]:.0f} / {b['inode_us'][1]:.0f} us (quiet ext4: ~20)"),
        ("broker CPU per rolled segment (produce, the sidecar's requests)",
         f"{1000 * b['broker_cpu_s'] / max(1, b['segments']):.2f} ms"),
    ]
    if "baseline" in b:
        x = b["baseline"]
        rows.append(("--baseline's sidecar beside it, CPU per rolled segment",
                     f"{1000 * x['cpu_s'] / max(1, b['segments']):.2f} ms ({x['cpu_s']:.1f} CPU s; caught up "
                     f"{x['catch_up_s']:.1f} s after the last record; peak RSS {x['peak_rss_mib']:.0f} MiB)"))
        rows.append(("--baseline's busiest threads, ms per rolled segment",
                     ", ".join(f"{name} {ms:.2f}" for name, ms in x["threads_ms_per_segment"][:12])))
        rows.append(("--baseline's apscheduler jobs, ms per rolled segment", ", ".join(
            f"{k} {v:.3f}" for k, v in sorted(x["jobs_ms_per_segment"].items(), key=lambda kv: -kv[1]))))
        rows.append(("--baseline's admin calls (and copy_runs) per rolled segment", ", ".join(
            f"{k} {v:.3f}" for k, v in sorted(x["calls_per_segment"].items())) or "(not counted by that checkout)"))
    return [(f"{tag}: {name}", value) for name, value in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--partitions", type=int, default=2000, help="partitions in all (2000; 4000 for the big run)")
    ap.add_argument("--topics", type=int, default=20, help="topics the partitions are spread over")
    ap.add_argument("--idle-s", type=float, default=60, help="seconds of each idle measurement")
    ap.add_argument("--segments-per-partition", type=int, default=3, help="segments each partition rolls in the burst")
    ap.add_argument("--skip-default", action="store_true", help="skip the idle phase at default intervals")
    ap.add_argument("--skip-burst", action="store_true", help="skip the burst")
    ap.add_argument("--profile", type=Path, help="record each idle phase with py-spy into this directory")
    ap.add_argument("--profile-gil", action="store_true", help="py-spy samples only the thread holding the GIL")
    ap.add_argument("--profile-rate", type=int, default=50, help="py-spy's samples a second (50)")
    ap.add_argument("--perf", type=Path,
                    help="record this checkout's sidecar in the (cold) burst with perf (kernel and librdkafka too) "
                         "into this directory, and print where its samples went")
    ap.add_argument("--baseline", type=Path,
                    help="another checkout (e.g. `git archive` of an older commit): its sidecar runs beside this one's "
                         "in the short-interval phase and the burst, on the same broker and load")
    ap.add_argument("--store-no-fsync", action="store_true",
                    help="the sidecar's filesystem store without fsyncs (LocalTieredStorage never fsyncs: Files.copy)")
    ap.add_argument("--copy-workers", type=int, default=0,
                    help="tasks.copy_workers of this checkout's sidecar (--baseline's keeps its default)")
    ap.add_argument("--copy-coalesce-ms", type=int, default=None,
                    help="tasks.copy_coalesce_ms of this checkout's sidecar (--baseline's keeps its default)")
    ap.add_argument("--copy-settle-ms", type=int, default=None,
                    help="tasks.copy_settle_ms of this checkout's sidecar (--baseline's keeps its default)")
    ap.add_argument("--warm", action="store_true",
                    help="after the (cold) burst, a second one of as many segments, measured the same way: every "
                         "partition's first copy (its directories, watermark file) is then behind it")
    ap.add_argument("--delete-delay-ms", type=int, default=60_000,
                    help="the broker's log.segment.delete.delay.ms (Kafka's default, 60000; the suite's brokers run "
                         "1000): below 4 stage intervals (20 s at the burst's 5 s) the sidecar stages every segment "
                         "at once, above it it copies them in place (rlm.tasks.in_place)")
    ap.add_argument("--skip-kafka-tiered", action="store_true",
                    help="skip the burst against Kafka's own tiered storage (LocalTieredStorage)")
    args = ap.parse_args()
    global COPY_COALESCE_MS, COPY_SETTLE_MS, COPY_WORKERS, PROFILE_GIL, PROFILE_RATE, STORE_FSYNC
    COPY_WORKERS = args.copy_workers
    COPY_COALESCE_MS = args.copy_coalesce_ms
    COPY_SETTLE_MS = args.copy_settle_ms
    PROFILE_GIL = args.profile_gil
    PROFILE_RATE = args.profile_rate
    STORE_FSYNC = not args.store_no_fsync
    if args.partitions % args.topics:
        ap.error("--partitions must be a multiple of --topics")
    for d in (args.profile, args.perf):
        if d:
            d.mkdir(parents=True, exist_ok=True)

    from devtools.devkafka import KafkaCluster

    work = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    rows: list[tuple[str, str]] = []
    compare: list[tuple[str, str, str]] = []
    prefix = "scale-"
    broker_cfg = {"log.flush.interval.messages": str(2**62), "num.io.threads": "4", "num.network.threads": "2",
                  "log.segment.delete.delay.ms": str(args.delete_delay_ms)}
    try:
        with KafkaCluster(brokers=1, broker_config=broker_cfg, heap="2g") as kc:
            t0 = time.monotonic()
            topics = create_topics(kc, prefix, args.topics, args.partitions)
            per_topic = args.partitions // args.topics
            print(f"{args.partitions} partitions in {args.topics} topics created in {time.monotonic() - t0:.0f}s",
                  file=sys.stderr)
            phases = []
            if not args.skip_default:
                phases.append(("default", 30_000, 10_000))
            phases.append(("short", 5_000, 5_000))
            idle_short: dict | None = None
            for name, copy_ms, disc_ms in phases:
                r = idle_phase(kc, work, name, args.partitions, prefix, copy_ms=copy_ms, discovery_ms=disc_ms,
                               idle_s=args.idle_s, profile_dir=args.profile,
                               baseline=args.baseline if name == "short" else None)
                label = f"copy {copy_ms / 1000:.0f} s, discovery {disc_ms / 1000:.0f} s"
                rows.append((f"idle CPU, {label}", f"{r['cpu_pct']:.1f}% of a core (machine load {r['load']:.1f})"))
                rows.append((f"idle RSS, {label}", f"{r['rss_mib']:.0f} MiB"))
                rows.append((f"start to leading all, {label}", f"{r['lead_s']:.1f} s (then {r['settle_s']:.0f} s until "
                             "its CPU settled)"))
                print(f"{name}: {r['cpu_pct']:.1f}% CPU, {r['rss_mib']:.0f} MiB", file=sys.stderr)
                if "baseline" in r:
                    rows.append((f"idle CPU, {label}, --baseline's sidecar beside it",
                                 f"{r['baseline']['cpu_pct']:.1f}% of a core, {r['baseline']['rss_mib']:.0f} MiB"))
                if name == "short" and not args.skip_burst:
                    idle_short = r
                else:
                    r["sidecar"].stop()
            if idle_short is not None:
                sc = idle_short["sidecar"]
                base = idle_short.get("baseline", {}).get("sidecar")
                try:
                    b = burst_phase(kc, sc, topics, per_topic, prefix, args.segments_per_partition,
                                    idle_short["cpu_pct"], args.profile, base, leave_open=args.warm,
                                    perf_dir=args.perf)
                    if args.warm:
                        settle(sc.pid)
                        bw = burst_phase(kc, sc, topics, per_topic, prefix, args.segments_per_partition,
                                         idle_short["cpu_pct"], None, base, warm=True)
                finally:
                    sc.stop()
                    if base is not None:
                        base.stop()
                rows.extend(burst_rows(b, "burst"))
                if args.warm:
                    rows.extend(burst_rows(bw, "warm burst"))
        if idle_short is not None and not args.skip_kafka_tiered:
            print("the same burst against Kafka's own tiered storage (LocalTieredStorage)", file=sys.stderr)
            k = kafka_tiered_phase(broker_cfg, work, prefix, args.topics, args.partitions,
                                   args.segments_per_partition, args.idle_s, 5_000)
            compare = side_by_side(b, idle_short, k, 5_000)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    w = max(len(r[0]) for r in rows)
    print(f"\n{'measure':<{w}}  value")
    for name, value in rows:
        print(f"{name:<{w}}  {value}")
    print(f"\n{args.partitions} partitions ({args.topics} topics), one broker, one sidecar (child process), "
          f"{os.cpu_count()} cores, idle over {args.idle_s:.0f} s")
    if compare:
        head = ("the burst, side by side", "sidecar (rlm serve)", "Kafka's RLM (LocalTieredStorage)")
        w0, w1 = (max(len(r[i]) for r in [head, *compare]) for i in (0, 1))
        print()
        for name, ours, theirs in [head, *compare]:
            print(f"{name:<{w0}}  {ours:<{w1}}  {theirs}")
    if args.profile:
        for f in [*sorted(args.profile.glob("idle-*.txt")), *args.profile.glob("burst.txt")]:
            print(f"\npy-spy, {f.stem}: share of on-CPU samples (inclusive)")
            for fn, share in top_functions(f):
                print(f"  {share:6.1%}  {fn}")
    if args.perf and (args.perf / "burst.perf.data").exists():
        print("\nperf, burst: share of samples by thread and object, then by symbol (self)")
        for line in perf_summary(args.perf / "burst.perf.data"):
            print(f"  {line}")


if __name__ == "__main__":
    main()
