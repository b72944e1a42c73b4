/*
 * reduce.h: element-wise reduction kernels of the host backend, for every dtype and
 * reduction of the public API.
 */
#ifndef AGENT_REDUCE_H
#define AGENT_REDUCE_H

#include <stddef.h>
#include <stdint.h>

/* Elements per call that reduce_n handles in one pass; callers chunk larger work. */
#define REDUCE_CHUNK 4096

/*
 * dst[i] = op(srcs[0][i], ..., srcs[nsrc-1][i]) for i < n (n <= REDUCE_CHUNK), with avg
 * dividing the sum by avg_div. dst may equal srcs[0] but no other source. float16,
 * bfloat16 and the float8s are reduced in float32 and rounded once (a float8 saturates at
 * its largest finite value); complex numbers are pairs (real, imaginary) of n elements.
 * Never fails for a dtype and op that fit (wire_redop_fits).
 */
void reduce_n(int dtype, int op, void *dst, const void *const *srcs, int nsrc, size_t n,
              uint32_t avg_div);

/*
 * A premultiplied sum: dst[i] = sum over k of srcs[k][i] * scalars[k] (each scalar the
 * dtype's bits, zero-extended), for any n. Integers modulo 2^bits; float32 and float64
 * in their type, in k order; the narrow floats multiply in float32, round each product
 * to the type, sum in float32 and round once. nsrc <= 64; dst may equal srcs[0] but no
 * other source. Bool and complex numbers are never asked for (wire_redop_fits).
 */
void reduce_premul_n(int dtype, void *dst, const void *const *srcs, const uint64_t *scalars,
                     int nsrc, size_t n);

/* Conversions used by the kernels and by tests (round to nearest even). */
float reduce_half_to_float(uint16_t h);
uint16_t reduce_float_to_half(float f);
float reduce_bf16_to_float(uint16_t b);
uint16_t reduce_float_to_bf16(float f);
/* The float8s: out of range (infinities too) saturates to the largest finite value. */
float reduce_e4m3_to_float(uint8_t b);
uint8_t reduce_float_to_e4m3(float f);
float reduce_e5m2_to_float(uint8_t b);
uint8_t reduce_float_to_e5m2(float f);

#endif
