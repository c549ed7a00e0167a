// Exact top-k baseline for bench/topk_bench.c: the k-th largest magnitude by
// std::nth_element on a copy of |x|, then one pass collecting the k pairs in
// index order (every |x| above it, ties at it from the lowest index), as a
// C++ user without a top-k library would do. Single-threaded, as
// std::nth_element is. Reads the raw f32 file topk_bench --write-data wrote;
// one JSON line per density, like topk_bench's.
//
//   nth_element_bench --file FILE [--density R[,R...]] [--repeats R] [--warmup W]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

size_t count_for(double density, size_t d) {  // tide_topk_count's rule
  double p = density * static_cast<double>(d);
  double r = std::nearbyint(p);
  double k = std::fabs(p - r) <= 1e-9 * (p > 1.0 ? p : 1.0) ? r : std::ceil(p);
  if (k <= 0.0) return 0;
  return k >= static_cast<double>(d) ? d : static_cast<size_t>(k);
}

double select(const std::vector<float> &x, size_t k, std::vector<float> &scratch,
              std::vector<float> &values, std::vector<uint32_t> &indices) {
  auto t0 = std::chrono::steady_clock::now();
  const size_t d = x.size();
  for (size_t i = 0; i < d; i++) scratch[i] = std::fabs(x[i]);
  std::nth_element(scratch.begin(), scratch.begin() + (k - 1), scratch.end(),
                   std::greater<float>());
  const float kth = scratch[k - 1];
  // Ties at kth: take as many as the k slots left after the larger ones.
  size_t above = 0;
  for (size_t i = 0; i < k - 1; i++) above += scratch[i] > kth;
  size_t ties = k - above, n = 0;
  for (size_t i = 0; i < d; i++) {
    float a = std::fabs(x[i]);
    if (a > kth || (a == kth && ties > 0)) {
      if (a == kth) ties--;
      values[n] = x[i];
      indices[n] = static_cast<uint32_t>(i);
      n++;
    }
  }
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

}  // namespace

int main(int argc, char **argv) {
  std::string file, densities = "0.001,0.01,0.1";
  int repeats = 5, warmup = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--file") file = argv[i + 1];
    else if (a == "--density") densities = argv[i + 1];
    else if (a == "--repeats") repeats = std::atoi(argv[i + 1]);
    else if (a == "--warmup") warmup = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "nth_element_bench: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (file.empty() || repeats < 1) {
    std::fprintf(stderr, "usage: nth_element_bench --file FILE [--density R,...] [--repeats R]\n");
    return 2;
  }
  FILE *f = std::fopen(file.c_str(), "rb");
  if (f == nullptr) {
    std::fprintf(stderr, "nth_element_bench: cannot open %s\n", file.c_str());
    return 1;
  }
  std::fseek(f, 0, SEEK_END);
  size_t d = static_cast<size_t>(std::ftell(f)) / sizeof(float);
  std::fseek(f, 0, SEEK_SET);
  std::vector<float> x(d), scratch(d);
  if (std::fread(x.data(), sizeof(float), d, f) != d) {
    std::fprintf(stderr, "nth_element_bench: short read of %s\n", file.c_str());
    return 1;
  }
  std::fclose(f);
  size_t start = 0;
  while (start <= densities.size()) {
    size_t comma = densities.find(',', start);
    if (comma == std::string::npos) comma = densities.size();
    double density = std::strtod(densities.substr(start, comma - start).c_str(), nullptr);
    start = comma + 1;
    size_t k = count_for(density, d);
    if (k == 0) continue;
    std::vector<float> values(k);
    std::vector<uint32_t> indices(k);
    std::vector<double> ms;
    for (int r = 0; r < warmup + repeats; r++) {
      double t = select(x, k, scratch, values, indices);
      if (r >= warmup) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    double med = ms.size() % 2 ? ms[ms.size() / 2] : (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]) / 2;
    double mass = 0;
    for (float v : values) mass += static_cast<double>(v) * v;
    std::printf("{\"bench\":\"topk\",\"impl\":\"nth_element\",\"d\":%zu,\"density\":%g,\"k\":%zu,"
                "\"threads\":1,\"median_ms\":%.3f,\"min_ms\":%.3f,\"mass\":%.9g}\n",
                d, density, k, med, ms.front(), mass);
    std::fflush(stdout);
  }
  return 0;
}
