#include "backend/cost_model.h"

#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

#include "common/check.h"

namespace gflow::backend {
namespace {

using Coeffs = std::array<double, 3>;  // of alpha, beta, gamma

int log2Floor(int n) {
  int k = 0;
  while ((2 << k) <= n) ++k;
  return k;
}

// What one allreduce of `bytes` over `ranks` costs in alpha, beta and gamma
// (cost_model.h); all zero for an algorithm the model does not know, which
// `known` says.
Coeffs coefficients(Algorithm algo, uint64_t bytes, int ranks, bool* known) {
  *known = true;
  if (ranks <= 1) return {0, 0, 0};
  const double n = static_cast<double>(bytes), N = ranks;
  const int steps = log2Floor(ranks);
  const double q = static_cast<double>(1 << steps);
  const Coeffs fold = q == N ? Coeffs{0, 0, 0} : Coeffs{2, 2 * n, n};
  switch (algo) {
    case Algorithm::kRing: return {2 * (N - 1), 2 * (N - 1) / N * n, (N - 1) / N * n};
    case Algorithm::kRecursiveDoubling:
      return {steps + fold[0], steps * n + fold[1], steps * n + fold[2]};
    case Algorithm::kHalvingDoubling:
      return {2.0 * steps + fold[0], 2 * (q - 1) / q * n + fold[1], (q - 1) / q * n + fold[2]};
    default: *known = false; return {0, 0, 0};
  }
}

[[noreturn]] void bad(const std::string& source, const std::string& what) {
  GFLOW_THROW(kInvalidArgument, ErrorContext::forOp("config")) << source << ": " << what;
}

// Least squares of rows `a` (scaled) against `b` over the parameters in
// `use`; false when they are not determined. Unused parameters stay 0.
bool solve(const std::vector<Coeffs>& a, const std::vector<double>& b, std::array<bool, 3> use,
           Coeffs* x, double* residual) {
  std::array<int, 3> idx{};
  int m = 0;
  for (int j = 0; j < 3; ++j) {
    if (use[j]) idx[m++] = j;
  }
  double ata[3][4] = {};  // normal equations, augmented
  for (size_t i = 0; i < a.size(); ++i) {
    for (int r = 0; r < m; ++r) {
      for (int c = 0; c < m; ++c) ata[r][c] += a[i][idx[r]] * a[i][idx[c]];
      ata[r][m] += a[i][idx[r]] * b[i];
    }
  }
  for (int c = 0; c < m; ++c) {  // Gauss-Jordan with partial pivoting
    int p = c;
    for (int r = c + 1; r < m; ++r) {
      if (std::fabs(ata[r][c]) > std::fabs(ata[p][c])) p = r;
    }
    if (std::fabs(ata[p][c]) < 1e-300) return false;
    for (int k = 0; k <= m; ++k) std::swap(ata[c][k], ata[p][k]);
    for (int r = 0; r < m; ++r) {
      if (r == c) continue;
      const double f = ata[r][c] / ata[c][c];
      for (int k = c; k <= m; ++k) ata[r][k] -= f * ata[c][k];
    }
  }
  *x = {0, 0, 0};
  for (int r = 0; r < m; ++r) {
    (*x)[idx[r]] = ata[r][m] / ata[r][r];
    if (!std::isfinite((*x)[idx[r]])) return false;
  }
  *residual = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = a[i][0] * (*x)[0] + a[i][1] * (*x)[1] + a[i][2] * (*x)[2] - b[i];
    *residual += e * e;
  }
  return true;
}

}  // namespace

const std::vector<Algorithm>& CostModel::algorithms() {
  static const std::vector<Algorithm> all = {Algorithm::kRecursiveDoubling,
                                             Algorithm::kHalvingDoubling, Algorithm::kRing};
  return all;
}

double CostModel::predict(Algorithm algo, uint64_t bytes, int ranks) const {
  bool known = false;
  const Coeffs c = coefficients(algo, bytes, ranks, &known);
  if (!known) return std::numeric_limits<double>::infinity();
  return c[0] * p_.alpha + c[1] * p_.beta + c[2] * p_.gamma;
}

Algorithm CostModel::fastest(uint64_t bytes, int ranks) const {
  Algorithm best = algorithms().front();
  for (Algorithm a : algorithms()) {
    if (predict(a, bytes, ranks) < predict(best, bytes, ranks)) best = a;
  }
  return best;
}

// Non-negative least squares over three unknowns: every subset of them,
// solved, the best fit whose parameters are all >= 0.
CostModel CostModel::fit(const std::vector<Sample>& samples) {
  std::vector<Coeffs> a;
  std::vector<double> b;
  for (const Sample& s : samples) {
    bool known = false;
    Coeffs c = coefficients(s.algo, s.bytes, s.ranks, &known);
    if (!known || s.ranks < 2 || !(s.seconds > 0)) continue;
    for (double& v : c) v /= s.seconds;  // relative error
    a.push_back(c);
    b.push_back(1.0);
  }
  if (a.size() < 3) {
    bad("model fit", std::to_string(a.size()) +
                         " usable samples (timed allreduces of ring, rd or hd on 2+ ranks); "
                         "it needs at least 3");
  }
  bool found = false;
  Coeffs best{};
  double bestResidual = std::numeric_limits<double>::infinity();
  for (int mask = 1; mask < 8; ++mask) {
    Coeffs x{};
    double residual = 0;
    if (!solve(a, b, {(mask & 1) != 0, (mask & 2) != 0, (mask & 4) != 0}, &x, &residual)) continue;
    if (x[0] < 0 || x[1] < 0 || x[2] < 0 || residual >= bestResidual) continue;
    found = true;
    best = x;
    bestResidual = residual;
  }
  if (!found) bad("model fit", "the samples do not determine alpha, beta and gamma");
  return CostModel(Params{best[0], best[1], best[2]});
}

std::string CostModel::text() const {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "gflow-model 1 alpha=%.9g beta=%.9g gamma=%.9g", p_.alpha,
                p_.beta, p_.gamma);
  return buf;
}

CostModel CostModel::parse(const std::string& text, const std::string& source) {
  std::istringstream is(text);
  std::string magic, version;
  if (!(is >> magic >> version) || magic != "gflow-model" || version != "1") {
    bad(source, "not a gflow cost model (it must start with 'gflow-model 1')");
  }
  Params p;
  bool seen[3] = {false, false, false};
  for (std::string field; is >> field;) {
    const size_t eq = field.find('=');
    const std::string key = field.substr(0, eq);
    if (key == "fitted_on") continue;  // where it was fitted (gflow_model), informational
    double* into = key == "alpha"   ? &p.alpha
                   : key == "beta"  ? &p.beta
                   : key == "gamma" ? &p.gamma
                                    : nullptr;
    if (!into || eq == std::string::npos) bad(source, "unknown field '" + field + "'");
    char* end = nullptr;
    const std::string v = field.substr(eq + 1);
    *into = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !std::isfinite(*into) || *into < 0) {
      bad(source, "'" + field + "' is not a finite number >= 0");
    }
    seen[into == &p.alpha ? 0 : into == &p.beta ? 1 : 2] = true;
  }
  if (!seen[0] || !seen[1] || !seen[2]) bad(source, "it needs alpha=, beta= and gamma=");
  return CostModel(p);
}

CostModel CostModel::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) bad("GFLOW_MODEL=" + path, "cannot read the file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse(ss.str(), "GFLOW_MODEL=" + path);
}

}  // namespace gflow::backend
