// A small Kafka Streams app for tests/rlm/listener/test_proxy_apps.py: counts the records of a topic per key, from
// the beginning (auto.offset.reset=earliest), and writes each key's count to an output topic.
//
//   java -cp <classes>:<kafka-streams libs>/* StreamsCount BOOTSTRAP APP_ID INPUT OUTPUT EXPECTED TIMEOUT_MS STATE_DIR
//
// The topology re-keys the stream (selectKey, the key unchanged) so that Streams makes a repartition topic, and
// counts into an in-memory store (changelogged), exactly once (transactions): both internal topics are created
// through BOOTSTRAP, like the output. Record caching is off, so every count reaches the output topic and the
// tracking below. Once the counts add up to EXPECTED records (or at TIMEOUT_MS), the app prints one line per key,
// "COUNT<TAB>key<TAB>count", keys as hex, then "TOTAL<TAB>n", closes Streams and exits 0 (2 on timeout, 1 if
// Streams died).
import java.time.Duration;
import java.util.HexFormat;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.Stores;

public final class StreamsCount {
    private StreamsCount() {}

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], appId = args[1], input = args[2], output = args[3];
        long expected = Long.parseLong(args[4]), timeoutMs = Long.parseLong(args[5]);
        String stateDir = args[6];

        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 200);
        props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
        // Transactions through the proxy too (InitProducerId, AddPartitionsToTxn, TxnOffsetCommit, EndTxn), and
        // read_committed on the repartition topic; no record is counted twice.
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG), 100);

        Map<Bytes, Long> counts = new ConcurrentHashMap<>();
        CountDownLatch done = new CountDownLatch(1);
        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(input, Consumed.with(Serdes.Bytes(), Serdes.Bytes()))
            .selectKey((k, v) -> k)
            .groupByKey(Grouped.with("rekeyed", Serdes.Bytes(), Serdes.Bytes()))
            .count(Materialized.<Bytes, Long>as(Stores.inMemoryKeyValueStore("counts"))
                .withKeySerde(Serdes.Bytes()).withValueSerde(Serdes.Long()))
            .toStream()
            .peek((k, n) -> {
                counts.put(k, n);
                if (counts.values().stream().mapToLong(Long::longValue).sum() >= expected) {
                    done.countDown();
                }
            })
            .to(output, Produced.with(Serdes.Bytes(), Serdes.Long()));

        AtomicReference<Throwable> failed = new AtomicReference<>();
        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        streams.setUncaughtExceptionHandler(e -> {
            failed.set(e);
            done.countDown();
            return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse
                .SHUTDOWN_CLIENT;
        });
        streams.start();
        boolean complete = done.await(timeoutMs, TimeUnit.MILLISECONDS);
        // Let the last counts' commit (and their output records) go out before closing.
        Thread.sleep(500);
        streams.close(Duration.ofSeconds(30));

        HexFormat hex = HexFormat.of();
        long total = 0;
        for (Map.Entry<Bytes, Long> e : new TreeMap<>(counts).entrySet()) {
            System.out.println("COUNT\t" + hex.formatHex(e.getKey().get()) + "\t" + e.getValue());
            total += e.getValue();
        }
        System.out.println("TOTAL\t" + total);
        System.out.flush();
        if (failed.get() != null) {
            failed.get().printStackTrace();
            System.exit(1);
        }
        System.exit(complete ? 0 : 2);
    }
}
