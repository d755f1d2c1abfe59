#!/usr/bin/env bash
# Certificates for the manifests' TLS, made with openssl: a CA, the orchestrator's
# certificate (the Service's names) and one certificate for every agent (the wildcard
# of the pods' DNS names, which the agents advertise), each key P-256, unencrypted.
#
#   deploy/make-certs.sh DIR [NAMESPACE] [CLUSTER_DOMAIN] [DAYS]
#
# Writes DIR/ca.pem, DIR/ca-key.pem (keep it off the cluster), DIR/orchestrator.pem,
# DIR/orchestrator-key.pem, DIR/agent.pem and DIR/agent-key.pem. Defaults: namespace
# timeslice, cluster domain cluster.local, 365 days. cert-manager can issue the same
# (README, "Deploying on Kubernetes").
set -euo pipefail

dir=${1:?usage: make-certs.sh DIR [NAMESPACE] [CLUSTER_DOMAIN] [DAYS]}
namespace=${2:-timeslice}
domain=${3:-cluster.local}
days=${4:-365}
mkdir -p "$dir"
umask 077

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days "$days" \
    -subj "/CN=timeslice-ca" -keyout "$dir/ca-key.pem" -out "$dir/ca.pem" 2>/dev/null

leaf() {  # NAME SUBJECT_ALT_NAMES
  local ext
  ext=$(mktemp)
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$2" > "$ext"
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=timeslice-$1" \
      -keyout "$dir/$1-key.pem" -out "$dir/$1.csr" 2>/dev/null
  openssl x509 -req -in "$dir/$1.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca-key.pem" \
      -CAcreateserial -days "$days" -extfile "$ext" -out "$dir/$1.pem" 2>/dev/null
  rm -f "$dir/$1.csr" "$ext" "$dir/ca.srl"
}

service=timeslice-orchestrator
leaf orchestrator "DNS:$service,DNS:$service.$namespace,DNS:$service.$namespace.svc,DNS:$service.$namespace.svc.$domain"
leaf agent "DNS:*.$namespace.pod.$domain"
chmod 0644 "$dir/ca.pem" "$dir/orchestrator.pem" "$dir/agent.pem"
echo "wrote $dir/{ca,orchestrator,agent}.pem and their keys" >&2
