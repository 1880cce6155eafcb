# Included from the top-level CMakeLists.txt (protobuf_generate derives output
# paths from CMAKE_CURRENT_SOURCE_DIR, which must be the source root).
#
# Generated protobuf and gRPC code, in its own library. Protos import each
# other by path from the source root ("dataset/dataset.proto"); generated
# headers are included the same way ("dataset/dataset.pb.h").
set(SLUICE_PROTOS dataset/dataset.proto rpc/service.proto control/journal.proto)
set(SLUICE_GRPC_PROTOS rpc/service.proto)
set(SLUICE_PROTO_OUT ${CMAKE_BINARY_DIR}/gen)
file(MAKE_DIRECTORY ${SLUICE_PROTO_OUT})
add_library(sluice_proto)
add_library(sluice::proto ALIAS sluice_proto)
set_target_properties(sluice_proto PROPERTIES EXPORT_NAME proto)
target_link_libraries(sluice_proto PUBLIC protobuf::libprotobuf gRPC::grpc++)
target_include_directories(sluice_proto PUBLIC $<BUILD_INTERFACE:${SLUICE_PROTO_OUT}>)
protobuf_generate(TARGET sluice_proto LANGUAGE cpp PROTOS ${SLUICE_PROTOS}
                  IMPORT_DIRS ${CMAKE_SOURCE_DIR} PROTOC_OUT_DIR ${SLUICE_PROTO_OUT})
protobuf_generate(TARGET sluice_proto LANGUAGE grpc PROTOS ${SLUICE_GRPC_PROTOS}
                  GENERATE_EXTENSIONS .grpc.pb.h .grpc.pb.cc
                  PLUGIN "protoc-gen-grpc=$<TARGET_FILE:gRPC::grpc_cpp_plugin>"
                  IMPORT_DIRS ${CMAKE_SOURCE_DIR} PROTOC_OUT_DIR ${SLUICE_PROTO_OUT})
install(TARGETS sluice_proto EXPORT sluiceTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
