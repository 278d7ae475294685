// The Java reader of bench/bench_proxy.py (--client java): Kafka's own KafkaConsumer, as Kafka Streams, Connect,
// Flink and Spark's kafka source read, doing what bench/proxy_child.py's `consume` does with librdkafka.
//
//   java -cp <classes>:<kafka-streams libs>/* ProxyConsume BOOTSTRAP TOPIC RECORDS PIDS GROUP [KEY=VALUE ...]
//
// One consumer (the client's defaults but group.id GROUP, auto.offset.reset=earliest, byte-array deserializers, and
// any KEY=VALUE given) subscribe()s to TOPIC and reads RECORDS records of each partition (comma-separated: partition
// 0's, 1's, ...), checking that each partition's are its offsets 0.. in order, each once; records past a partition's
// count are left out. The read window starts at the group's assignment (onPartitionsAssigned) and ends at the last
// record. At both ends it reads the CPU seconds of the processes PIDS (comma-separated) from /proc/<pid>/stat, its
// own (this JVM, every thread: the JIT's and the GC's too) and its main thread's (the poll loop: the Java consumer
// fetches and parses inside poll(), on the caller's thread). Prints one JSON line as proxy_child.py does:
// {"window_s", "first_s", "records", "bytes" (keys + values), "cpu": {pid: s}, "consumer_cpu_s", "consumer_main_s"}.
// Exits 1 on a wrong offset (the message says which), 2 when the records do not come within 30 minutes.
import java.io.IOException;
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Collection;
import java.util.List;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public final class ProxyConsume {
    private static final long TIMEOUT_NS = 30L * 60 * 1_000_000_000L;
    private static final long TICKS = 100; // USER_HZ: /proc/<pid>/stat counts in clock ticks (100 on Linux)

    private ProxyConsume() {}

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1], group = args[4];
        long[] records = parseLongs(args[2]);
        long[] pids = parseLongs(args[3]);
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        for (int i = 5; i < args.length; i++) {
            int eq = args[i].indexOf('=');
            props.put(args[i].substring(0, eq), args[i].substring(eq + 1));
        }
        ThreadMXBean threads = ManagementFactory.getThreadMXBean();
        double[] mark = new double[pids.length + 3]; // window start (s), the pids' CPU, own CPU, main thread's CPU
        boolean[] marked = {false};
        long[] expect = new long[records.length];
        int left = records.length;
        long n = 0, size = 0;
        double first = 0;
        long start = System.nanoTime();
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
            consumer.subscribe(List.of(topic), new ConsumerRebalanceListener() {
                @Override
                public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
                    if (!partitions.isEmpty() && !marked[0]) {
                        marked[0] = true;
                        mark[0] = System.nanoTime() / 1e9;
                        for (int i = 0; i < pids.length; i++) {
                            mark[i + 1] = cpuSeconds(pids[i]);
                        }
                        mark[pids.length + 1] = cpuSeconds(ProcessHandle.current().pid());
                        mark[pids.length + 2] = threads.getCurrentThreadCpuTime() / 1e9;
                    }
                }

                @Override
                public void onPartitionsRevoked(Collection<TopicPartition> partitions) {}
            });
            outer:
            while (left > 0) {
                if (System.nanoTime() - start > TIMEOUT_NS) {
                    System.err.println("read " + n + " records in 30 minutes");
                    System.exit(2);
                }
                for (ConsumerRecord<byte[], byte[]> m : consumer.poll(Duration.ofSeconds(1))) {
                    int p = m.partition();
                    if (expect[p] == records[p]) {
                        continue; // past its count
                    }
                    if (m.offset() != expect[p]) {
                        System.err.println(topic + "-" + p + ": offset " + m.offset() + " where " + expect[p]
                                + " was expected");
                        System.exit(1);
                    }
                    expect[p]++;
                    if (n == 0) {
                        first = System.nanoTime() / 1e9;
                    }
                    n++;
                    size += (m.value() == null ? 0 : m.value().length) + (m.key() == null ? 0 : m.key().length);
                    if (expect[p] == records[p] && --left == 0) {
                        break outer;
                    }
                }
            }
            double end = System.nanoTime() / 1e9;
            StringBuilder cpu = new StringBuilder();
            for (int i = 0; i < pids.length; i++) {
                cpu.append(i == 0 ? "" : ", ").append('"').append(pids[i]).append("\": ")
                        .append(cpuSeconds(pids[i]) - mark[i + 1]);
            }
            double own = cpuSeconds(ProcessHandle.current().pid()) - mark[pids.length + 1];
            double main = threads.getCurrentThreadCpuTime() / 1e9 - mark[pids.length + 2];
            System.out.println("{\"window_s\": " + (end - mark[0]) + ", \"first_s\": " + (first - mark[0])
                    + ", \"records\": " + n + ", \"bytes\": " + size + ", \"cpu\": {" + cpu
                    + "}, \"consumer_cpu_s\": " + own + ", \"consumer_main_s\": " + main + "}");
        }
    }

    private static long[] parseLongs(String csv) {
        String[] parts = csv.split(",");
        long[] out = new long[parts.length];
        for (int i = 0; i < parts.length; i++) {
            out[i] = Long.parseLong(parts[i]);
        }
        return out;
    }

    /** User + system CPU seconds of a process (every thread) so far, from /proc/PID/stat (fields 14, 15). */
    private static double cpuSeconds(long pid) {
        try {
            String stat = Files.readString(Path.of("/proc/" + pid + "/stat"));
            String[] f = stat.substring(stat.lastIndexOf(')') + 2).split(" ");
            return (Long.parseLong(f[11]) + Long.parseLong(f[12])) / (double) TICKS;
        } catch (IOException e) {
            throw new IllegalStateException("cannot read /proc/" + pid + "/stat", e);
        }
    }
}
