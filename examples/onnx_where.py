"""ONNX Where-16: the seed's examples (strings aside: JAX has no string dtype). The table is
the only transcription of them: tests/test_select_seeds.py runs it under every implementation."""
import jax
import numpy as np

import jax_ext

jax.config.update("jax_enable_x64", True)  # the examples include float64, int64, uint64

T, F = True, False
nan, inf = np.nan, np.inf
EXAMPLES = {  # name: (condition, x, y, dtype, expected output)
    "cc_where_bool": ([[T, F], [T, F]], [[T, T], [F, F]], [[F, F], [T, T]], np.bool_,
                      [[T, F], [F, T]]),
    "cc_where_double": ([[T, F], [T, F]], [[1., 2.], [3., 4.]], [[5., 6.], [7., 8.]],
                        np.float64, [[1., 6.], [3., 8.]]),
    "cc_where_int16": ([[T, F], [T, F]], [[1, 2], [3, 4]], [[-5, -6], [-7, -8]], np.int16,
                       [[1, -6], [3, -8]]),
    "cc_where_int8": ([[T, F], [T, F]], [[1, 2], [3, 4]], [[-5, -6], [-7, -8]], np.int8,
                      [[1, -6], [3, -8]]),
    "cc_where_nan_inf": ([T, F, T, F, T, F], [nan, 1., inf, 2., -inf, 3.],
                         [0., nan, 0., inf, 0., -inf], np.float32,
                         [nan, nan, inf, inf, -inf, -inf]),
    "cc_where_nan_inf_bcast": ([[T], [F]], [[inf, 1., inf], [2., inf, 3.]], [[-inf, nan, 0.]],
                               np.float32, [[inf, 1., inf], [-inf, nan, 0.]]),
    "cc_where_uint16": ([[T, F], [T, F]], [[1, 2], [3, 4]], [[5, 6], [7, 8]], np.uint16,
                        [[1, 6], [3, 8]]),
    "cc_where_uint32": ([[T, F], [T, F]], [[1, 2], [3, 4]], [[5, 6], [7, 8]], np.uint32,
                        [[1, 6], [3, 8]]),
    "cc_where_uint64": ([[T, F], [T, F]], [[1, 2], [3, 4]], [[5, 6], [7, 8]], np.uint64,
                        [[1, 6], [3, 8]]),
    "cc_where_uint8": ([[T, F], [T, F]], [[1, 2], [3, 4]], [[5, 6], [7, 8]], np.uint8,
                       [[1, 6], [3, 8]]),
    "where_bcast": ([[T], [F]], [[1, 2, 3], [4, 5, 6]], [[10, 20, 30]], np.int32,
                    [[1, 2, 3], [10, 20, 30]]),
    "where_example": ([[T, F], [T, F]], [[1., 2.], [3., 4.]], [[5., 6.], [7., 8.]],
                      np.float32, [[1., 6.], [3., 8.]]),
    "where_long_example": ([[T, F], [T, T]], [[1, 2], [3, 4]], [[9, 8], [7, 6]], np.int64,
                           [[1, 8], [3, 4]]),
}



def main() -> None:
    for name, (c, x, y, dtype, want) in EXAMPLES.items():
        out = jax_ext.where(np.array(c), np.array(x, dtype), np.array(y, dtype))
        assert out.dtype == dtype and out.shape == np.array(want).shape, name
        # Bit for bit: NaN payloads included.
        assert np.asarray(out).tobytes() == np.array(want, dtype).tobytes(), name
        print(f"{name:24s} {np.asarray(out).tolist()}")


if __name__ == "__main__":  # tests/test_select_seeds.py imports EXAMPLES
    main()
