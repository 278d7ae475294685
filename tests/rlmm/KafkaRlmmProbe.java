// Asks Kafka's own classes (from the broker jars) what they make of our metadata: test oracle for tests/rlmm.
// stdin, one command per line:
//   P <topic id as 32 hex digits> <partition> <numMetadataPartitions>  -> RemoteLogMetadataTopicPartitioner result
//   M <bytes hex>  -> Utils.murmur2 of the bytes
//   D <record value hex>  -> "R <hex of Kafka's re-serialization>" then "S <toString()>", or "E <exception>"
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.math.BigInteger;
import java.util.HexFormat;

import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.utils.Utils;
import org.apache.kafka.server.log.remote.metadata.storage.RemoteLogMetadataTopicPartitioner;
import org.apache.kafka.server.log.remote.metadata.storage.serialization.RemoteLogMetadataSerde;
import org.apache.kafka.server.log.remote.storage.RemoteLogMetadata;

public class KafkaRlmmProbe {
    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        RemoteLogMetadataSerde serde = new RemoteLogMetadataSerde();
        HexFormat hex = HexFormat.of();
        String line;
        while ((line = in.readLine()) != null) {
            String[] f = line.trim().split(" ");
            if (f[0].equals("P")) {
                BigInteger id = new BigInteger(f[1], 16);
                long msb = id.shiftRight(64).longValue();
                long lsb = id.longValue();
                TopicIdPartition tp = new TopicIdPartition(new Uuid(msb, lsb), Integer.parseInt(f[2]), "t");
                System.out.println(new RemoteLogMetadataTopicPartitioner(Integer.parseInt(f[3])).metadataPartition(tp));
            } else if (f[0].equals("M")) {
                System.out.println(Utils.murmur2(f.length > 1 ? hex.parseHex(f[1]) : new byte[0]));
            } else if (f[0].equals("D")) {
                try {
                    RemoteLogMetadata md = serde.deserialize(hex.parseHex(f[1]));
                    System.out.println("R " + hex.formatHex(serde.serialize(md)));
                    System.out.println("S " + md);
                } catch (Exception e) {
                    System.out.println("E " + e);
                }
            }
        }
    }
}
