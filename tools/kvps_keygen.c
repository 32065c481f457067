/* kvps-keygen - makes a CURVE key pair as two certificate files in CZMQ's zcert format:
   NAME.cert (public: give it to the other side) and NAME.cert_secret (keep it; mode 0600).

   usage: kvps-keygen NAME...

   A server loads its NAME.cert_secret (kvps_cert_load) for curve_secret_key and lists its
   workers' public keys in curve_clients; a worker loads its own NAME.cert_secret and the
   servers' NAME.cert for curve_server_keys. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <zmq.h>

static int write_cert(const char *path, const char *pub, const char *sec, int mode) {
    FILE *f = fopen(path, "w");
    if (!f) { perror(path); return 1; }
    char when[64];
    time_t now = time(NULL);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", gmtime(&now));
    fprintf(f, "#   ****  Generated on %s by kvps-keygen  ****\n", when);
    fprintf(f, "#   ZeroMQ CURVE %s Certificate\n", sec ? "**Secret**" : "Public");
    fprintf(f, "#   %s\n\n", sec ? "DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions."
                                  : "Exchange securely, or use a secure mechanism to verify the contents");
    fprintf(f, "#   of this file after exchange. Store public certificates in your home\n#   directory, in the .curve subdirectory.\n\n");
    fprintf(f, "metadata\ncurve\n    public-key = \"%s\"\n", pub);
    if (sec) fprintf(f, "    secret-key = \"%s\"\n", sec);
    if (fclose(f) != 0) { perror(path); return 1; }
    return chmod(path, (mode_t)mode) != 0;
}

int main(int argc, char **argv) {
    if (argc < 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: kvps-keygen NAME...  (writes NAME.cert and NAME.cert_secret)\n");
        return 2;
    }
    if (!zmq_has("curve")) { fprintf(stderr, "kvps-keygen: this libzmq was built without CURVE\n"); return 1; }
    for (int i = 1; i < argc; i++) {
        char pub[41], sec[41], path[4096];
        if (zmq_curve_keypair(pub, sec) != 0) { fprintf(stderr, "kvps-keygen: zmq_curve_keypair failed\n"); return 1; }
        snprintf(path, sizeof path, "%s.cert_secret", argv[i]);
        if (write_cert(path, pub, sec, 0600)) return 1;
        snprintf(path, sizeof path, "%s.cert", argv[i]);
        if (write_cert(path, pub, NULL, 0644)) return 1;
        printf("%s.cert, %s.cert_secret: public key %s\n", argv[i], argv[i], pub);
    }
    return 0;
}
