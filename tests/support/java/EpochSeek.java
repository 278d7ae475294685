// Kafka's own KafkaConsumer validating a position with its leader epoch (KIP-320), for
// tests/rlm/listener/test_proxy_epochs.py:
//
//   java -cp <classes>:<kafka-streams libs>/* EpochSeek BOOTSTRAP TOPIC PARTITION OFFSET EPOCH END RESET TIMEOUT_MS
//
// assign()s TOPIC-PARTITION (no group), seek()s it to OFFSET with leader epoch EPOCH (the consumer validates the
// position with OffsetForLeaderEpoch before it fetches), auto.offset.reset=RESET (earliest, latest, none), and polls
// until it has read the record before END (exclusive). Prints a line a record as it comes, flushed:
// "RECORD\t<offset>\t<key as hex>", then "DONE". Exits 2 on a consumer exception (its class and message printed as
// "ERROR\t<class>\t<message>", e.g. a LogTruncationException with RESET none), 3 when END is not reached within
// TIMEOUT_MS.
import java.time.Duration;
import java.util.HexFormat;
import java.util.List;
import java.util.Optional;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public final class EpochSeek {
    private EpochSeek() {}

    public static void main(String[] args) {
        String bootstrap = args[0], topic = args[1], reset = args[6];
        int partition = Integer.parseInt(args[2]), epoch = Integer.parseInt(args[4]);
        long offset = Long.parseLong(args[3]), end = Long.parseLong(args[5]), timeoutMs = Long.parseLong(args[7]);
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, reset);
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, "100");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        TopicPartition tp = new TopicPartition(topic, partition);
        long deadline = System.nanoTime() + timeoutMs * 1_000_000L;
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
            consumer.assign(List.of(tp));
            consumer.seek(tp, new OffsetAndMetadata(offset, Optional.of(epoch), ""));
            while (System.nanoTime() < deadline) {
                for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(200))) {
                    String key = r.key() == null ? "-" : HexFormat.of().formatHex(r.key());
                    System.out.println("RECORD\t" + r.offset() + "\t" + key);
                    System.out.flush();
                    if (r.offset() >= end - 1) {
                        System.out.println("DONE");
                        System.out.flush();
                        return;
                    }
                }
            }
        } catch (RuntimeException e) {
            System.out.println("ERROR\t" + e.getClass().getName() + "\t" + e.getMessage());
            System.out.flush();
            System.exit(2);
        }
        System.exit(3);
    }
}
