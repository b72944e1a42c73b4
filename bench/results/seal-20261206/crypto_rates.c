#include <sodium.h>
#include <stdio.h>
#include <time.h>
#include <string.h>
static double now()
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
/* libsodium's rates on 64 KiB records, one core: gcc -O2 crypto_rates.c -lsodium */
int main()
{
    if (sodium_init() < 0) return 1;
    size_t n = 65536;
    unsigned char *b = malloc(n + 16), k[32] = {1}, npub[12] = {0}, tag[16];
    crypto_aead_aes256gcm_state st;
    crypto_aead_aes256gcm_beforenm(&st, k);
    int N = 2000;
    double t = now();
    for (int i = 0; i < N; i++)
        crypto_aead_aes256gcm_encrypt_detached_afternm(b, tag, NULL, b, n, NULL, 0, NULL, npub,
                                                       &st);
    printf("aesgcm enc %.2f GB/s\n", N * n / (now() - t) / 1e9);
    t = now();
    for (int i = 0; i < N; i++)
        crypto_aead_aes256gcm_encrypt_detached_afternm(b, tag, NULL, b, 0, b, n, NULL, npub, &st);
    printf("aesgcm mac-only (AD) %.2f GB/s\n", N * n / (now() - t) / 1e9);
    t = now();
    for (int i = 0; i < N; i++)
        crypto_aead_chacha20poly1305_ietf_encrypt_detached(b, tag, NULL, b, n, NULL, 0, NULL, npub,
                                                           k);
    printf("chacha enc %.2f GB/s\n", N * n / (now() - t) / 1e9);
    t = now();
    for (int i = 0; i < N; i++)
        crypto_aead_chacha20poly1305_ietf_encrypt_detached(b, tag, NULL, b, 0, b, n, NULL, npub, k);
    printf("chacha mac-only %.2f GB/s\n", N * n / (now() - t) / 1e9);
    t = now();
    for (int i = 0; i < N; i++)
        crypto_onetimeauth_poly1305(tag, b, n, k);
    printf("poly1305 %.2f GB/s\n", N * n / (now() - t) / 1e9);
    unsigned char h[32];
    t = now();
    for (int i = 0; i < N; i++)
        crypto_generichash(h, 32, b, n, k, 32);
    printf("blake2b %.2f GB/s\n", N * n / (now() - t) / 1e9);
}
