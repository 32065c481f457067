/* On the include path of tests/compile/codec_only.c only: a kvps_codec.h program that reaches
   for ZeroMQ fails to compile here. */
#error "zmq.h included: kvps_codec.h (and kvps_core.h without kvps.h or kvps_ring.h) must not need ZeroMQ"
