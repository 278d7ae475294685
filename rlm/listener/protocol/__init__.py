"""The Kafka wire protocol of the listener, and nothing else: which APIs we know (:mod:`.apis`), how a request and
a response are framed (:mod:`.frame`), and the message codecs (:mod:`.codec`, by kio). No sockets, no policy."""
