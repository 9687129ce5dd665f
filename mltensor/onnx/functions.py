"""Functions at import: a node calling a model-local FunctionProto, or an op ONNX defines as a
function of other ops (e.g. Celu, Mish, Swish) and no handler maps, is expanded into its body."""

import onnx
from onnx import TensorProto, helper


class FunctionExpansion:
    """Importer methods (mixed into onnx/importer.Importer)."""

    def domain_function(self, node):
        f = self.functions.get((node.domain, node.op_type))
        return (f,) if f is not None else None

    def expand_function(self, node, fp, ins, schema_defaults=None):
        """Inline a FunctionProto: rename its values, bind formal inputs, resolve attribute refs."""
        self._uid += 1
        prefix = f"__{fp.name}{self._uid}/"
        rename = {}
        for formal, actual in zip(fp.input, node.input):
            rename[formal] = actual
        for formal in fp.input[len(node.input) :]:
            rename[formal] = ""
        for formal, actual in zip(fp.output, node.output):
            rename[formal] = actual
        given = {a.name: a for a in node.attribute}
        defaults = dict(schema_defaults or {})
        defaults.update({a.name: a for a in fp.attribute_proto})
        body = []
        for n in fp.node:
            n2 = onnx.NodeProto()
            n2.CopyFrom(n)
            del n2.input[:]
            del n2.output[:]
            n2.input.extend(rename.get(x, prefix + x) if x else "" for x in n.input)
            n2.output.extend(rename.get(x, prefix + x) if x else "" for x in n.output)
            del n2.attribute[:]
            for a in n.attribute:
                if a.ref_attr_name:
                    src = given.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
                    if src is None:
                        continue
                    a2 = onnx.AttributeProto()
                    a2.CopyFrom(src)
                    a2.name = a.name
                    n2.attribute.append(a2)
                else:
                    n2.attribute.append(a)
            if not n2.name:
                n2.name = f"{node.name or node.op_type}/{n.op_type}"
            body.append(n2)
        opset = self.cur_opset
        for o in fp.opset_import:
            if o.domain in ("", "ai.onnx"):
                opset = o.version
        saved_node = self.node
        self.run_nodes(body, opset)
        self.node = saved_node

    def expand_schema_function(self, node, ins):
        """Expand an op that ONNX defines as a function of other ops (e.g. Celu, Mish, Swish)."""
        try:
            schema = onnx.defs.get_schema(node.op_type, self.cur_opset, node.domain)
        except Exception:
            return False
        raw = None
        try:
            vers = [v for v in schema.function_opset_versions if v <= self.cur_opset]
            if schema.has_function and vers:
                raw = schema.get_function_with_opset_version(max(vers))
            else:
                vers = [v for v in schema.context_dependent_function_opset_versions if v <= self.cur_opset]
                if schema.has_context_dependent_function and vers:
                    types = []
                    for name, v in zip(node.input, ins):
                        et = self.onnx_type(v, name) if v is not None else TensorProto.FLOAT
                        shp = list(v.shape) if v is not None else None
                        types.append(helper.make_tensor_type_proto(et, shp).SerializeToString())
                    raw = schema.get_context_dependent_function_with_opset_version(
                        max(vers), node.SerializeToString(), types
                    )
        except Exception:
            raw = None
        if not raw:
            return False
        fp = onnx.FunctionProto()
        fp.ParseFromString(raw)
        if not fp.node:
            return False
        if any(n.op_type == node.op_type and n.domain == node.domain for n in fp.node):
            return False
        defaults = {}
        for name, a in schema.attributes.items():
            if a.default_value is not None and a.default_value.type:
                defaults[name] = a.default_value
        self.expand_function(node, fp, ins, defaults)
        return True
