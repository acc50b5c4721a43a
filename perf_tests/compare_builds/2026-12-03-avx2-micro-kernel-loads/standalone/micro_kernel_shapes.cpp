#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>
typedef float F8 __attribute__((vector_size(32)));
struct P { F8 v; static P load(const float* p){P r; std::memcpy(&r.v,p,32); return r;} void store(float*p)const{std::memcpy(p,&v,32);} };
template <int R, int V, bool Pin>
__attribute__((noinline)) void mt(int depth, const float* a, int ars, int ads, const float* b, int ldb, float* c, int ldc, bool acc_in) {
  P acc[R][V];
#pragma GCC unroll 64
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 64
    for (int v = 0; v < V; ++v) acc[r][v] = acc_in ? P::load(c + r*ldc + v*8) : P{F8{}};
  for (int k = 0; k < depth; ++k) {
    P bk[V];
#pragma GCC unroll 64
    for (int v = 0; v < V; ++v) { bk[v] = P::load(b + k*ldb + v*8); if (Pin) asm("" : "+x"(bk[v].v)); }
#pragma GCC unroll 64
    for (int r = 0; r < R; ++r) { const float x = a[r*ars + k*ads];
#pragma GCC unroll 64
      for (int v = 0; v < V; ++v) acc[r][v].v = x * bk[v].v + acc[r][v].v; }
  }
#pragma GCC unroll 64
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 64
    for (int v = 0; v < V; ++v) acc[r][v].store(c + r*ldc + v*8);
}
template <int R, int V, bool Pin>
void tile(int rows, int cols, int depth, const float* a, int ars, int ads, const float* b, int ldb, float* c, int ldc) {
  const int ct = cols/(V*8), fr = rows/R, rt = fr + rows%R;
  for (int t = 0; t < rt*ct; ++t) { int r = t/ct, col = (t%ct)*V*8;
    if (r < fr) mt<R,V,Pin>(depth, a + r*R*ars, ars, ads, b+col, ldb, c + r*R*ldc+col, ldc, false);
    else { int row = fr*R + r-fr; mt<1,V,Pin>(depth, a+row*ars, ars, ads, b+col, ldb, c+row*ldc+col, ldc, false);} }
}
template <int R, int V, bool Pin> void bench(const char* name, int rows, int depth) {
  std::vector<float> a(rows*depth, 0.5f), b(depth*64, 0.25f), c(rows*64);
  double best = 1e9;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 2000; ++i) tile<R,V,Pin>(rows, 64, depth, a.data(), depth, 1, b.data(), 64, c.data(), 64);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now()-t0).count();
    if (s < best) best = s;
  }
  std::printf("%-14s rows %3d depth %3d: %.1f GFLOP/s (c %.1f)\n", name, rows, depth, 2.0*rows*64*depth*2000/best/1e9, c[5]);
}
int main() {
  for (int depth : {64, 128}) {
    bench<2,4,false>("2x4 fold", 64, depth);
    bench<2,4,true>("2x4 pinned", 64, depth);
    bench<4,2,true>("4x2 pinned", 64, depth);
    bench<6,2,true>("6x2 pinned", 64, depth);
    bench<6,2,false>("6x2 fold", 64, depth);
    bench<5,2,true>("5x2 pinned", 64, depth);
    bench<3,4,true>("3x4 pinned", 64, depth);
  }
  // the O += V^T P shape: rows = D, depth = block (64)
  bench<2,4,false>("2x4 fold", 128, 64);
  bench<2,4,true>("2x4 pinned", 128, 64);
  bench<6,2,true>("6x2 pinned", 128, 64);
  bench<4,2,true>("4x2 pinned", 128, 64);
}
