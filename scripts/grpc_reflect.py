"""A small grpcurl stand-in that needs no .proto and no generated code: server reflection only.

  python scripts/grpc_reflect.py ADDRESS list
  python scripts/grpc_reflect.py ADDRESS describe specdec.v1.GenerateRequest
  python scripts/grpc_reflect.py ADDRESS call specdec.v1.Orchestrator/Generate '{"prompt": "Hi", "max_new_tokens": 8}'

`call` fetches the service's file descriptors through grpc.reflection.v1alpha, builds the
request and response classes in a fresh DescriptorPool (google.protobuf.message_factory),
sends the JSON request (proto3 JSON mapping) and prints the response as JSON; a server
streaming method prints one JSON object per message. With grpcurl installed the same is:
  grpcurl -plaintext ADDRESS list
  grpcurl -plaintext -d '{"prompt": "Hi"}' ADDRESS specdec.v1.Orchestrator/Generate
"""

from __future__ import annotations

import argparse
import json
import sys

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc


class Reflector:
    """Talks to one server's reflection service and builds descriptors from what it returns."""

    def __init__(self, channel: grpc.Channel, timeout: float = 10.0) -> None:
        self.stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        self.timeout = timeout
        self.pool = descriptor_pool.DescriptorPool()
        self._files: dict[str, descriptor_pb2.FileDescriptorProto] = {}

    def _ask(self, **kwargs) -> reflection_pb2.ServerReflectionResponse:
        reply = next(
            iter(
                self.stub.ServerReflectionInfo(
                    iter([reflection_pb2.ServerReflectionRequest(**kwargs)]), timeout=self.timeout
                )
            )
        )
        if reply.HasField("error_response"):
            raise LookupError(f"reflection: {reply.error_response.error_message} ({kwargs})")
        return reply

    def list_services(self) -> list[str]:
        reply = self._ask(list_services="")
        return sorted(s.name for s in reply.list_services_response.service)

    def _load(self, protos: list[bytes]) -> None:
        for raw in protos:
            fdp = descriptor_pb2.FileDescriptorProto.FromString(raw)
            self._files.setdefault(fdp.name, fdp)
        for name in list(self._files):
            self._add(name)

    def _add(self, name: str) -> None:
        """Add a file after its dependencies (fetching any the server did not send)."""
        try:
            self.pool.FindFileByName(name)
            return
        except KeyError:
            pass
        if name not in self._files:
            self._load(list(self._ask(file_by_filename=name).file_descriptor_response.file_descriptor_proto))
        fdp = self._files[name]
        for dep in fdp.dependency:
            self._add(dep)
        self.pool.Add(fdp)

    def symbol(self, name: str):
        self._load(list(self._ask(file_containing_symbol=name).file_descriptor_response.file_descriptor_proto))
        for find in (self.pool.FindServiceByName, self.pool.FindMessageTypeByName, self.pool.FindMethodByName):
            try:
                return find(name)
            except KeyError:
                continue
        raise LookupError(f"{name} not found")

    def method(self, full: str):
        """'pkg.Service/Method' -> (method descriptor, request class, response class)."""
        service_name, method_name = full.split("/")
        service = self.symbol(service_name)
        method = service.methods_by_name[method_name]
        return (
            method,
            message_factory.GetMessageClass(method.input_type),
            message_factory.GetMessageClass(method.output_type),
        )

    def call(self, channel: grpc.Channel, full: str, request_json: str, timeout: float, metadata=()):
        """Yield the response(s) of a unary or server-streaming method, as messages."""
        method, req_cls, resp_cls = self.method(full)
        request = json_format.Parse(request_json or "{}", req_cls())
        path = "/" + full
        if method.server_streaming:
            call = channel.unary_stream(
                path, request_serializer=req_cls.SerializeToString, response_deserializer=resp_cls.FromString
            )
            yield from call(request, timeout=timeout, metadata=metadata)
        else:
            call = channel.unary_unary(
                path, request_serializer=req_cls.SerializeToString, response_deserializer=resp_cls.FromString
            )
            yield call(request, timeout=timeout, metadata=metadata)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("address")
    parser.add_argument("verb", choices=["list", "describe", "call"])
    parser.add_argument("name", nargs="?")
    parser.add_argument("data", nargs="?", default="{}")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--token")
    args = parser.parse_args(argv)
    metadata = (("authorization", f"Bearer {args.token}"),) if args.token else ()
    with grpc.insecure_channel(args.address) as channel:
        r = Reflector(channel)
        if args.verb == "list":
            print("\n".join(r.list_services()))
        elif args.verb == "describe":
            d = r.symbol(args.name)
            proto = (
                descriptor_pb2.DescriptorProto() if hasattr(d, "fields") else descriptor_pb2.ServiceDescriptorProto()
            )
            d.CopyToProto(proto)
            print(proto)
        else:
            try:
                for msg in r.call(channel, args.name, args.data, args.timeout, metadata):
                    print(
                        json.dumps(
                            json_format.MessageToDict(msg, preserving_proto_field_name=True),
                            ensure_ascii=False,
                            indent=2,
                        )
                    )
            except grpc.RpcError as exc:
                print(f"ERROR: {exc.code().name}: {exc.details()}", file=sys.stderr)
                return 1
    assert not any(m.startswith("specdec") for m in sys.modules), "no specdec code may be imported"
    return 0


if __name__ == "__main__":
    sys.exit(main())
