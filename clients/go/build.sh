#!/bin/sh
# Builds the Go worker into $1 (default ./lowtide-go-worker) with Debian's packaged toolchain (or
# another main package's file, $2: the soak's worker is soak/go_worker/main.go):
# golang-go, protobuf-compiler, protoc-gen-go-grpc and the libraries golang-google-protobuf-dev and
# golang-google-grpc-dev (GOPATH mode, so no module download). protoc-gen-go is built here from
# golang-google-protobuf-dev's source (APIv2, which knows proto3 `optional`; Debian's
# protoc-gen-go-1-3 does not). The stubs are generated from protos/ into a temporary GOPATH,
# never committed.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
protos="$here/../../protos"
out=${1:-./lowtide-go-worker}
main=${2:-$here/worker/main.go}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pkg=lowtide/lowtidev1
export GOPATH="$work:/usr/share/gocode" GO111MODULE=off GOCACHE="${GOCACHE:-$work/cache}"
go build -o "$work/bin/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go
PATH="$work/bin:$PATH"
mkdir -p "$work/src/$pkg" "$work/src/lowtide/worker"
maps=""
for f in task schedule scheduler signal worker; do
    maps="$maps --go_opt=Mlowtide/v1/$f.proto=$pkg --go-grpc_opt=Mlowtide/v1/$f.proto=$pkg"
done
# shellcheck disable=SC2086 # $maps is a list of options
protoc -I "$protos" --go_out="$work/src/$pkg" --go_opt=paths=source_relative \
    --go-grpc_out="$work/src/$pkg" --go-grpc_opt=paths=source_relative $maps \
    "$protos"/lowtide/v1/*.proto
mv "$work/src/$pkg"/lowtide/v1/*.go "$work/src/$pkg/"
cp "$main" "$work/src/lowtide/worker/main.go"
go build -o "$out" lowtide/worker
