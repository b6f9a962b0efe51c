#!/bin/sh
# Dev-only TLS certificates for compose and deploy/k8s: a CA, a server certificate for NATS, one
# for etcd, and the client certificate the jetcrawl services show etcd (it requires one).
#
#   deploy/certs/make-dev-certs.sh [DIR]     # default: deploy/certs/dev (git-ignored)
#
# DIR gets ca.pem, nats.pem/.key, etcd.pem/.key and client.pem/.key; the CA's key is deleted once
# it has signed them. The names cover compose (nats, etcd), Kubernetes (the Services and pods of
# deploy/k8s in namespace jetcrawl) and loopback. The keys are readable by every user (0644) so the
# containers' non-root users can read them from a bind mount: for development only. Anywhere
# else use your own CA and give each service only its own key.
set -eu

dir=${1:-$(dirname "$0")/dev}
days=825
mkdir -p "$dir"
cd "$dir"

openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 -subj "/CN=jetcrawl dev CA" \
    -keyout ca.key -out ca.pem \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    2>/dev/null

# issue NAME EXTENDED_KEY_USAGE [SUBJECT_ALT_NAMES]
issue() {
    printf 'basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n' >"$1.ext"
    printf 'extendedKeyUsage=%s\n' "$2" >>"$1.ext"
    if [ -n "${3:-}" ]; then printf 'subjectAltName=%s\n' "$3" >>"$1.ext"; fi
    openssl req -newkey rsa:2048 -nodes -sha256 -subj "/CN=$1" -keyout "$1.key" -out "$1.csr" \
        2>/dev/null
    openssl x509 -req -sha256 -days "$days" -in "$1.csr" -CA ca.pem -CAkey ca.key \
        -CAcreateserial -extfile "$1.ext" -out "$1.pem" 2>/dev/null
    rm -f "$1.csr" "$1.ext"
    chmod 0644 "$1.key"
}

k8s() { # the DNS names of a Service $1 and its pods in namespace jetcrawl
    echo "DNS:$1,DNS:*.$1,DNS:$1.jetcrawl.svc,DNS:*.$1.jetcrawl.svc,DNS:*.$1.jetcrawl.svc.cluster.local"
}
loopback="DNS:localhost,IP:127.0.0.1"

issue nats serverAuth "$(k8s nats),$(k8s nats-client),$loopback"
issue etcd serverAuth,clientAuth "$(k8s etcd),$(k8s etcd-client),$loopback"
issue client clientAuth
rm -f ca.key ca.srl
echo "dev certificates in $(pwd): ca.pem, nats.pem/.key, etcd.pem/.key, client.pem/.key"
