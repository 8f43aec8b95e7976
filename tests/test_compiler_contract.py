"""The compiler contract (coralrt._compile.base): coralrt's compilers subclass it, a
minimal subclass compiles through the JIT on ``sim``, and a third-party compiler
that only has the attributes (duck typing) still registers and compiles."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_inputs, shared_model

import coralrt
from coralrt import InferenceSession
from coralrt._compile.base import Compiler, SegmentNotMapped, as_compiler
from coralrt._compile.edgetpu_compiler import EdgeTpuCompiler
from coralrt.plugins import NativeCompiler
from coralrt._compile.remote import RemoteCompiler
from coralrt._compile.segments import compile_model
from coralrt.errors import SegmentNotMapped as ErrorsSegmentNotMapped
from coralrt._formats import segment as seg_format
from coralrt._formats import segment_codec
from coralrt._formats.opnames import SEGMENT_OP
from coralrt import load_model
from coralrt.plugins._host import PluginHost

MODEL = "split_concat.tflite"


class Minimal(Compiler):
    """The least a compiler needs: id, version, runs_on and compile_segment."""

    id = "minimal"
    version = "1"
    runs_on = ("sim",)

    def __init__(self):
        self.pieces = 0

    def compile_segment(self, piece):
        self.pieces += 1
        return segment_codec.encode(seg_format.build_segment(
            piece, compiler_id=self.id, compiler_version=self.version))


class Duck:
    """A third-party compiler written before the base class: attributes only, no op_name."""

    id = "duck"
    runs_on = ("sim",)

    def __init__(self):
        self.asked = 0

    @property
    def version(self):
        self.asked += 1
        return "2"

    def compile_segment(self, piece):
        return NativeCompiler().compile_segment(piece)


def _plugin(compiler):
    class Plugin:
        @coralrt.hookimpl
        def coralrt_register_compilers(self, registry):
            registry.add(compiler)
    return Plugin()


def _outputs(sess, feed):
    return [np.asarray(a) for a in sess.run(feed).values()]


def test_coralrt_compilers_subclass_the_contract():
    for cls in (NativeCompiler, EdgeTpuCompiler, RemoteCompiler):
        assert issubclass(cls, Compiler)
    native = NativeCompiler()
    assert as_compiler(native) is native
    assert native.op_name == SEGMENT_OP and native.runs_on == ("sim",)
    # SegmentNotMapped is part of the contract, and still the error coralrt.errors exports.
    assert SegmentNotMapped is ErrorsSegmentNotMapped


def test_a_subclass_must_implement_the_contract():
    class NoId(Compiler):
        version, runs_on = "1", ("sim",)

        def compile_segment(self, piece):
            return b""

    with pytest.raises(TypeError, match="id"):
        NoId()


def test_a_minimal_subclass_compiles_through_the_jit_on_sim():
    compiler = Minimal()
    sess = InferenceSession(shared_model(MODEL), target="sim", plugins=[_plugin(compiler)])
    assert compiler.pieces >= 1
    assert sess.compile_info["compiler"] == "minimal 1"
    assert sess.compile_info["summary"]["tpu_ops"] > 0
    feed = dict(zip([i.name for i in sess.get_inputs()], random_inputs(sess.get_inputs(), seed=3)))
    reference = InferenceSession(shared_model(MODEL), target="sim")
    for ours, theirs in zip(_outputs(sess, feed), _outputs(reference, feed)):
        np.testing.assert_array_equal(ours, theirs)


def test_a_duck_typed_compiler_still_registers_and_compiles():
    duck = Duck()
    host = PluginHost([_plugin(duck)])
    assert host.compilers.for_device("sim") is duck    # registered as it is
    assert duck.asked == 0                              # its version is read when needed
    sess = InferenceSession(shared_model(MODEL), target="sim", plugins=[_plugin(duck)])
    assert sess.compile_info["compiler"] == "duck 2"
    # Seen through the contract: what it leaves out has the contract's defaults.
    class Bare:
        id, version = "bare", "0"

        def compile_segment(self, piece):
            raise SegmentNotMapped(range(len(piece.main.operators)))

    bare = as_compiler(Bare())
    assert isinstance(bare, Compiler)
    assert (bare.id, bare.version, bare.runs_on, bare.op_name) == ("bare", "0", (), SEGMENT_OP)
    # A compiler that maps nothing leaves every operator on the CPU.
    result = compile_model(load_model(shared_model(MODEL)), compiler=Bare())
    assert result.plan.segments == [] and result.compiler == "bare 0"
