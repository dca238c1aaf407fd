/* OpenBLAS cblas_sgemm at 512x512x2048 (m, n, k), row-major, for comparison
   with exec/gemm's BenchmarkSgemm512x512x2048. Run with
   OPENBLAS_NUM_THREADS=1, and OPENBLAS_CORETYPE=SkylakeX for its AVX-512
   kernels. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(void) {
	const int m = 512, n = 512, k = 2048, reps = 50;
	float *a = malloc(sizeof(float) * m * k), *b = malloc(sizeof(float) * k * n), *c = malloc(sizeof(float) * m * n);
	for (int i = 0; i < m * k; i++) a[i] = (float)rand() / RAND_MAX;
	for (int i = 0; i < k * n; i++) b[i] = (float)rand() / RAND_MAX;
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1, a, k, b, n, 0, c, n);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int r = 0; r < reps; r++)
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1, a, k, b, n, 0, c, n);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
	printf("openblas sgemm 512x512x2048: %.1f GFLOP/s\n", 2.0 * m * n * k * reps / s / 1e9);
	return 0;
}
