"""The Python package on the host backend: graphs built, run and read in Python's idioms,
errors as exceptions carrying the library's message, handles released by `with` and `close()`."""

import array
import struct
import unittest

import gkrt


def floats(values):
    return array.array("f", values).tobytes()


def unpack(data):
    return list(array.array("f", data))


class GraphTest(unittest.TestCase):
    def test_relu_then_scale_matches_python(self):
        xs = [(-1.0) ** i * i / 3 for i in range(1024)]
        with gkrt.Runtime(device="host", memory_limit=64 << 20) as rt, rt.graph() as g:
            self.assertEqual(rt.device, "host")
            x = g.tensor(4096, "input", "x")
            h = g.tensor(4096, "intermediate", "h")
            y = g.tensor(4096, "output", "y")
            with rt.builtin("relu") as relu, rt.builtin("scale") as scale:
                g.add(relu, [x], [h])
                g.add(scale, [h], [y], params=struct.pack("f", 2.0))
            g.finalize()
            self.assertEqual(g.info()["finalized"], 1)
            self.assertEqual(g.info()["num_nodes"], 2)
            g.write(x, floats(xs))
            rt.run(g)
            got = unpack(g.read(y))
            want = unpack(floats([max(v, 0.0) * 2.0 for v in xs]))
            self.assertEqual(got, want)
            stats = rt.stats()
            self.assertEqual(stats["runs"], 1)
            self.assertEqual(stats["nodes_launched"], 2)

    def test_bound_memory_in_place_and_async_runs(self):
        # On the host backend device memory is host memory: gkrt_malloc blocks, read and written
        # here through ctypes, stand in for a framework's device tensors (on the GPU:
        # data_ptr(), python/gpu_bind_check.py).
        import ctypes
        from gkrt._lib import lib
        xs = [float(i % 13) - 6.0 for i in range(256)]
        with gkrt.Runtime(device="host") as rt, rt.graph() as g:
            ptrs = []
            for _ in range(2):
                p = ctypes.c_void_p()
                self.assertEqual(lib.gkrt_malloc(rt.handle, 1024, None, ctypes.byref(p)), 0)
                ptrs.append(p.value)
            xbuf = (ctypes.c_float * 256).from_address(ptrs[0])
            ybuf = (ctypes.c_float * 256).from_address(ptrs[1])
            xbuf[:] = xs
            x = g.tensor(1024, "input", "x")
            y = g.tensor(1024, "output", "y")
            with rt.builtin("scale") as scale:
                g.add(scale, [x], [y], params=struct.pack("f", 3.0))
            g.finalize()
            g.bind(x, ptrs[0])
            g.bind(y, ptrs[1])
            allocated = rt.stats()["allocated_bytes"]
            rt.run_async(g)
            g.wait()
            self.assertEqual(list(ybuf), [v * 3.0 for v in xs])
            self.assertEqual(rt.stats()["allocated_bytes"], allocated)
            xbuf[0] = 100.0  # changed in place, read by the next run
            rt.run_async(g)
            g.wait()
            self.assertEqual(ybuf[0], 300.0)
            with self.assertRaises(gkrt.GkrtError) as e:
                g.bind(x, 0)
            self.assertIn("x", str(e.exception))
            g.unbind(x)
            with self.assertRaises(gkrt.GkrtError):
                rt.run(g)
            g.unbind(y)
            for p in ptrs:
                self.assertEqual(lib.gkrt_free(rt.handle, p, None), 0)

    def test_planned_mode_and_matmul(self):
        m = n = k = 4
        a = [float(i) for i in range(m * k)]
        b = [float(i % 3) for i in range(k * n)]
        with gkrt.Runtime(device="host", memory_mode="planned") as rt, rt.graph() as g:
            ta = g.tensor(4 * m * k, "input")
            tb = g.tensor(4 * k * n, "parameter")
            tc = g.tensor(4 * m * n, "output")
            with rt.builtin("matmul") as mm:
                g.add(mm, [ta, tb], [tc], params=struct.pack("3I", m, n, k))
            g.finalize()
            g.write(ta, floats(a))
            g.write(tb, floats(b))
            rt.run(g)
            c = unpack(g.read(tc))
            for i in range(m):
                for j in range(n):
                    s = 0.0
                    for p in range(k):
                        s = unpack(floats([s + unpack(floats([a[i * k + p] * b[p * n + j]]))[0]]))[0]
                    self.assertEqual(c[i * n + j], s)


class ErrorTest(unittest.TestCase):
    def test_errors_carry_status_and_message(self):
        with gkrt.Runtime(device="host") as rt, rt.graph() as g:
            with self.assertRaises(gkrt.GkrtError) as e:
                g.tensor(0, "input", "empty")
            self.assertEqual(e.exception.status_name, "INVALID_ARGUMENT")
            self.assertIn("empty", str(e.exception))
            x = g.tensor(64, "input", "x")
            y = g.tensor(64, "output", "y")
            with rt.builtin("relu") as relu:
                g.add(relu, [x], [y])
            with self.assertRaises(gkrt.GkrtError) as e:
                rt.run(g)
            self.assertEqual(e.exception.status_name, "INVALID_STATE")
            g.finalize()
            with self.assertRaises(gkrt.GkrtError) as e:
                g.write(x, bytes(3))
            self.assertIn("3 bytes", str(e.exception))
            self.assertEqual(rt.stats()["allocated_bytes"], 0)

    def test_node_names_appear_in_messages(self):
        with gkrt.Runtime(device="host", memory_limit=96 << 10) as rt, rt.graph() as g:
            x = g.tensor(64 << 10, "input", "x")
            y = g.tensor(64 << 10, "output", "y")
            with rt.builtin("relu") as relu:
                g.add(relu, [x], [y], name="too_big")
            g.finalize()
            g.write(x, bytes(64 << 10))
            with self.assertRaises(gkrt.GkrtError) as e:
                rt.run(g)
            self.assertEqual(e.exception.status_name, "OUT_OF_MEMORY")
            self.assertIn("node 0 'too_big' (built-in relu)", str(e.exception))

    def test_bad_names_are_value_errors(self):
        with self.assertRaises(ValueError):
            gkrt.Runtime(device="tpu")
        with gkrt.Runtime(device="host") as rt:
            with self.assertRaises(ValueError):
                rt.builtin("gelu")
            with self.assertRaises(TypeError):
                gkrt.Runtime(device="host", no_such_field=1)

    def test_closed_handles_raise_and_close_is_idempotent(self):
        rt = gkrt.Runtime(device="host")
        g = rt.graph()
        rt.close()  # the graph keeps its runtime alive
        x = g.tensor(16, "input")
        self.assertIsInstance(x, int)
        g.close()
        g.close()
        with self.assertRaises(gkrt.GkrtError):
            g.tensor(16, "input")
        with self.assertRaises(gkrt.GkrtError):
            rt.stats()

    def test_version(self):
        self.assertRegex(gkrt.version(), r"^\d+\.\d+\.\d+")


class TorchRecordStreamTest(unittest.TestCase):
    """gkrt.torch.record_stream on the process-wide runtime of the PyTorch entry points (the host
    backend here): a tensor stand-in with only what the function reads, so no torch is needed."""

    def test_record_stream_names_the_block_and_reports_bad_ones(self):
        import ctypes
        import types

        import gkrt.torch
        from gkrt._lib import lib

        lib.gkrt_torch_alloc.restype = ctypes.c_void_p
        lib.gkrt_torch_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        lib.gkrt_torch_free.restype = None
        lib.gkrt_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                        ctypes.c_void_p]

        def tensor(ptr):
            storage = types.SimpleNamespace(data_ptr=lambda: ptr)
            return types.SimpleNamespace(untyped_storage=lambda: storage,
                                         device=types.SimpleNamespace(index=0))

        default = types.SimpleNamespace(cuda_stream=None)
        ptr = lib.gkrt_torch_alloc(4096, 0, None)
        self.assertTrue(ptr)
        gkrt.torch.record_stream(tensor(ptr), default)
        gkrt.torch.record_stream(tensor(0), default)  # no memory: nothing to name
        with self.assertRaises(gkrt.GkrtError) as e:
            gkrt.torch.record_stream(tensor(ptr + 256), default)
        self.assertIn("not a live block", str(e.exception))
        lib.gkrt_torch_free(ptr, 4096, 0, None)
        with self.assertRaises(gkrt.GkrtError):
            gkrt.torch.record_stream(tensor(ptr), default)


if __name__ == "__main__":
    unittest.main()
