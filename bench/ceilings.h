// Machine ceilings for the decode benchmark: a vectorised streaming read and a
// register-resident FMA loop. Each ISA lives in its own translation unit
// compiled with that ISA's -m flags (like kernels/cpu); the caller picks one at
// run time from what the CPU supports.
#pragma once

#include <cstdint>

namespace vc::bench {

// Sum of p[0..n) (n a multiple of 128), read with wide loads into many
// independent accumulators so the loop is bound by memory, not add latency.
float ReadSumAvx512(const float* p, int64_t n);
float ReadSumAvx2(const float* p, int64_t n);
float ReadSumScalar(const float* p, int64_t n);

// `iters` rounds of independent FMAs over a register-resident set of
// accumulators. Returns a value that depends on every FMA (so nothing is
// optimised away); FmaFlopsPerIter*() gives the FLOPs one round performs.
float FmaLoopAvx512(int64_t iters);
float FmaLoopAvx2(int64_t iters);
float FmaLoopScalar(int64_t iters);
int64_t FmaFlopsPerIterAvx512();
int64_t FmaFlopsPerIterAvx2();
int64_t FmaFlopsPerIterScalar();

}  // namespace vc::bench
