"""TensorFlow's ``tf.train.Example`` message, built with the protobuf library (no TensorFlow needed).

The descriptors are those of ``tensorflow/core/example/{example,feature}.proto``
(field names and numbers are the wire format), made at import from
``descriptor_pb2`` in a pool of their own, so they never clash with
TensorFlow's if a program imports both::

    message BytesList { repeated bytes value = 1; }
    message FloatList { repeated float value = 1 [packed = true]; }
    message Int64List { repeated int64 value = 1 [packed = true]; }
    message Feature { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
    message Features { map<string, Feature> feature = 1; }
    message Example { Features features = 1; }
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = ["Example"]

_F = descriptor_pb2.FieldDescriptorProto


def _file() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(name="chute/tf_example.proto", package="tensorflow", syntax="proto3")

    def message(name: str, *fields: tuple[str, int, int, int, str, dict[str, Any]]) -> descriptor_pb2.DescriptorProto:
        msg = proto.message_type.add(name=name)
        for field_name, number, ftype, label, type_name, extra in fields:
            field = msg.field.add(name=field_name, number=number, type=ftype, label=label)
            if type_name:
                field.type_name = type_name
            if "oneof" in extra:
                field.oneof_index = extra["oneof"]
            if extra.get("packed"):
                field.options.packed = True
        return msg

    repeated, optional = _F.LABEL_REPEATED, _F.LABEL_OPTIONAL
    message("BytesList", ("value", 1, _F.TYPE_BYTES, repeated, "", {}))
    message("FloatList", ("value", 1, _F.TYPE_FLOAT, repeated, "", {"packed": True}))
    message("Int64List", ("value", 1, _F.TYPE_INT64, repeated, "", {"packed": True}))
    feature = message(
        "Feature",
        ("bytes_list", 1, _F.TYPE_MESSAGE, optional, ".tensorflow.BytesList", {"oneof": 0}),
        ("float_list", 2, _F.TYPE_MESSAGE, optional, ".tensorflow.FloatList", {"oneof": 0}),
        ("int64_list", 3, _F.TYPE_MESSAGE, optional, ".tensorflow.Int64List", {"oneof": 0}),
    )
    feature.oneof_decl.add(name="kind")
    features = message("Features", ("feature", 1, _F.TYPE_MESSAGE, repeated, ".tensorflow.Features.FeatureEntry", {}))
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=_F.TYPE_STRING, label=optional)
    entry.field.add(name="value", number=2, type=_F.TYPE_MESSAGE, label=optional, type_name=".tensorflow.Feature")
    message("Example", ("features", 1, _F.TYPE_MESSAGE, optional, ".tensorflow.Features", {}))
    return proto


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file())
Example: Any = message_factory.GetMessageClass(_POOL.FindMessageTypeByName("tensorflow.Example"))
"""The ``tf.train.Example`` message class (``Example.FromString(record)``)."""
