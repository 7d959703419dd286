/* CRC32C (Castagnoli, reflected polynomial 0x82F63B78), as used by iSCSI, ext4 and Kafka.
 *
 * x86-64 with SSE4.2: the crc32 instruction has a latency of 3 cycles and a throughput of 1 per cycle, so
 * three independent streams are run side by side and joined with a precomputed "shift by N zero bytes"
 * operator (the technique of Mark Adler's crc32c.c). Elsewhere: slicing-by-8 tables.
 * The register is kept inverted inside; crc32c_update takes and returns the finished (non-inverted) value,
 * so crc32c_update(crc32c_update(0, a), b) == crc32c_update(0, a || b).
 */
#ifndef DANUBE_FAST_CRC32C_H
#define DANUBE_FAST_CRC32C_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

#define CRC32C_POLY 0x82F63B78u
#define CRC32C_LONG 8192
#define CRC32C_SHORT 256

static uint32_t crc32c_table[8][256];
static uint32_t crc32c_long_shift[4][256];
static uint32_t crc32c_short_shift[4][256];
static int crc32c_hw_available = 0;

static uint32_t crc32c_sw_register(uint32_t reg, const unsigned char *p, size_t len) {
    while (len && ((uintptr_t)p & 7)) {
        reg = crc32c_table[0][(reg ^ *p++) & 0xff] ^ (reg >> 8);
        len--;
    }
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= reg;
        reg = crc32c_table[7][w & 0xff] ^ crc32c_table[6][(w >> 8) & 0xff] ^
              crc32c_table[5][(w >> 16) & 0xff] ^ crc32c_table[4][(w >> 24) & 0xff] ^
              crc32c_table[3][(w >> 32) & 0xff] ^ crc32c_table[2][(w >> 40) & 0xff] ^
              crc32c_table[1][(w >> 48) & 0xff] ^ crc32c_table[0][w >> 56];
        p += 8;
        len -= 8;
    }
    while (len--) reg = crc32c_table[0][(reg ^ *p++) & 0xff] ^ (reg >> 8);
    return reg;
}

/* The register after feeding `len` zero bytes is a linear function of the register before: tabulate it per
 * byte of the input register. */
static void crc32c_make_shift(uint32_t table[4][256], size_t len) {
    uint32_t basis[32];
    unsigned char zeros[CRC32C_LONG];
    memset(zeros, 0, sizeof zeros);
    for (int bit = 0; bit < 32; bit++) basis[bit] = crc32c_sw_register(1u << bit, zeros, len);
    for (int k = 0; k < 4; k++) {
        for (int b = 0; b < 256; b++) {
            uint32_t v = 0;
            for (int i = 0; i < 8; i++)
                if (b & (1 << i)) v ^= basis[8 * k + i];
            table[k][b] = v;
        }
    }
}

static inline uint32_t crc32c_shift(uint32_t table[4][256], uint32_t reg) {
    return table[0][reg & 0xff] ^ table[1][(reg >> 8) & 0xff] ^ table[2][(reg >> 16) & 0xff] ^
           table[3][reg >> 24];
}

#if defined(__x86_64__)
__attribute__((target("sse4.2")))
static uint32_t crc32c_hw_register(uint32_t reg, const unsigned char *p, size_t len) {
    uint64_t c0 = reg, c1, c2, w0, w1, w2;
    while (len && ((uintptr_t)p & 7)) {
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
        len--;
    }
    while (len >= 3 * CRC32C_LONG) {
        const unsigned char *end = p + CRC32C_LONG;
        c1 = c2 = 0;
        do {
            memcpy(&w0, p, 8);
            memcpy(&w1, p + CRC32C_LONG, 8);
            memcpy(&w2, p + 2 * CRC32C_LONG, 8);
            c0 = _mm_crc32_u64(c0, w0);
            c1 = _mm_crc32_u64(c1, w1);
            c2 = _mm_crc32_u64(c2, w2);
            p += 8;
        } while (p < end);
        c0 = crc32c_shift(crc32c_long_shift, (uint32_t)c0) ^ (uint32_t)c1;
        c0 = crc32c_shift(crc32c_long_shift, (uint32_t)c0) ^ (uint32_t)c2;
        p += 2 * CRC32C_LONG;
        len -= 3 * CRC32C_LONG;
    }
    while (len >= 3 * CRC32C_SHORT) {
        const unsigned char *end = p + CRC32C_SHORT;
        c1 = c2 = 0;
        do {
            memcpy(&w0, p, 8);
            memcpy(&w1, p + CRC32C_SHORT, 8);
            memcpy(&w2, p + 2 * CRC32C_SHORT, 8);
            c0 = _mm_crc32_u64(c0, w0);
            c1 = _mm_crc32_u64(c1, w1);
            c2 = _mm_crc32_u64(c2, w2);
            p += 8;
        } while (p < end);
        c0 = crc32c_shift(crc32c_short_shift, (uint32_t)c0) ^ (uint32_t)c1;
        c0 = crc32c_shift(crc32c_short_shift, (uint32_t)c0) ^ (uint32_t)c2;
        p += 2 * CRC32C_SHORT;
        len -= 3 * CRC32C_SHORT;
    }
    while (len >= 8) {
        memcpy(&w0, p, 8);
        c0 = _mm_crc32_u64(c0, w0);
        p += 8;
        len -= 8;
    }
    while (len--) c0 = _mm_crc32_u8((uint32_t)c0, *p++);
    return (uint32_t)c0;
}
#endif

static void crc32c_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        crc32c_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = crc32c_table[0][n];
        for (int k = 1; k < 8; k++) {
            c = crc32c_table[0][c & 0xff] ^ (c >> 8);
            crc32c_table[k][n] = c;
        }
    }
    crc32c_make_shift(crc32c_long_shift, CRC32C_LONG);
    crc32c_make_shift(crc32c_short_shift, CRC32C_SHORT);
#if defined(__x86_64__)
    crc32c_hw_available = __builtin_cpu_supports("sse4.2");
#endif
}

static uint32_t crc32c_update(uint32_t crc, const unsigned char *p, size_t len) {
    uint32_t reg = ~crc;
#if defined(__x86_64__)
    if (crc32c_hw_available) return ~crc32c_hw_register(reg, p, len);
#endif
    return ~crc32c_sw_register(reg, p, len);
}

#endif
