# Writes copies of etcd's own .proto files (Debian's golang-etcd-server-dev) that plain
# protoc can compile, so that keel generates its etcd stubs from the installed etcd and never
# carries a copy of them. Run with cmake -P:
#   cmake -DSRC_ROOT=/usr/share/gocode/src/go.etcd.io/etcd -DDST_ROOT=<dir>
#         -DFILES=etcdserver/etcdserverpb/rpc.proto,mvcc/mvccpb/kv.proto,... -P this file
# Each file lands at <DST_ROOT>/etcd/<path>: etcd's protos import each other as
# "etcd/<path>", so <DST_ROOT> is the one import root protoc needs.
# Taken out, because they only shape etcd's Go code or its HTTP gateway, never the wire:
#   - the gogoproto import and every (gogoproto.*) option, file-wide or on a field;
#   - the google/api/annotations.proto import and its `option (google.api.http) = {...};`
#     blocks (the grpc-gateway's URL mapping).
foreach(var SRC_ROOT DST_ROOT FILES)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "trim_etcd_proto.cmake: -D${var}=... is required")
  endif()
endforeach()

string(REPLACE "," ";" files "${FILES}")
foreach(rel IN LISTS files)
  set(src "${SRC_ROOT}/${rel}")
  if(NOT EXISTS "${src}")
    message(FATAL_ERROR "trim_etcd_proto.cmake: ${src} not found (scripts/install-deps.sh "
                        "installs golang-etcd-server-dev)")
  endif()
  file(READ "${src}" text)
  string(REGEX REPLACE "import \"gogoproto/gogo.proto\";\n?" "" text "${text}")
  string(REGEX REPLACE "import \"google/api/annotations.proto\";\n?" "" text "${text}")
  string(REGEX REPLACE "option \\(gogoproto\\.[a-z_]+\\) *= *[^;]*;\n?" "" text "${text}")
  # A gateway block nests braces one level deep (additional_bindings { ... }).
  string(REGEX REPLACE "option \\(google\\.api\\.http\\) *= *{([^{}]|{[^{}]*})*} *;\n?" ""
         text "${text}")
  # Field options: drop each (gogoproto.x) = v, then an option list left empty (only where
  # there were some: comments elsewhere say "[]byte").
  if(text MATCHES "\\(gogoproto\\.")
    string(REGEX REPLACE "\\(gogoproto\\.[a-z_]+\\) *= *[^],]+,? *" "" text "${text}")
    string(REGEX REPLACE " *\\[ *\\]" "" text "${text}")
    string(REGEX REPLACE ", *\\]" "]" text "${text}")
  endif()
  if(text MATCHES "gogoproto|google\\.api")
    message(FATAL_ERROR "trim_etcd_proto.cmake: ${rel} still names gogoproto or google.api "
                        "after trimming: its options changed shape")
  endif()
  set(dst "${DST_ROOT}/etcd/${rel}")
  # Rewritten only when changed, so that a reconfigure does not rebuild the stubs.
  set(old "")
  if(EXISTS "${dst}")
    file(READ "${dst}" old)
  endif()
  if(NOT old STREQUAL text)
    file(WRITE "${dst}" "${text}")
  endif()
endforeach()
