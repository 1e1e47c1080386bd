// What sdqes-run and the C API share around a step backend (sdqes/step_backend.hpp): scoring the queries from a step,
// the graph's own cosines where it was exported with --fuse-queries, and the refusal of a backend that does not exist.
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "sdqes/runtime.hpp"
#include "sdqes/step_backend.hpp"

namespace {

// A backend that gives fixed numbers: an embedding, and where `rows` > 0 the cosines a fused graph gives.
class FixedStep : public sdqes::StepBackend {
 public:
  FixedStep(std::vector<float> embedding, int rows, std::vector<float> cosines)
      : embedding_(std::move(embedding)), rows_(rows), cosines_(std::move(cosines)) {}
  const std::vector<float>& step(const std::vector<float>&) override { return embedding_; }
  void reset() override {}
  void keep_streams(const std::vector<int>&) override {}
  void reset_stream(int) override {}
  std::vector<uint8_t> stream_state(int) const override { return {}; }  // a graph without temporal state
  void set_stream_state(int, const std::vector<uint8_t>&) override {}
  std::vector<size_t> state_element_bytes() const override { return {}; }
  void warm_up() override {}
  int query_rows() const override { return rows_; }
  const std::vector<float>& cosines() const override {
    return rows_ > 0 ? cosines_ : sdqes::StepBackend::cosines();
  }

 private:
  std::vector<float> embedding_;
  int rows_;
  std::vector<float> cosines_;
};

// Two queries of a 2-wide embedding space: (1, 0) and (0, 1).
sdqes::QueryTable two_queries() {
  sdqes::QueryTable table;
  table.texts = {"first", "second"};
  table.embeddings = {1.0f, 0.0f, 0.0f, 1.0f};
  table.dim = 2;
  return table;
}

float sigmoid(double x) { return static_cast<float>(1.0 / (1.0 + std::exp(-x))); }

}  // namespace

TEST(QueryProbabilities, AreTheEmbeddingAgainstEachQueryWhereTheGraphLeavesScoringToItsCaller) {
  FixedStep step({0.6f, 0.8f}, 0, {});
  const auto& embedding = step.step({});
  const auto p = sdqes::query_probabilities(step, embedding, two_queries());
  ASSERT_EQ(p.size(), 2u);
  EXPECT_FLOAT_EQ(p[0], sigmoid(0.6));
  EXPECT_FLOAT_EQ(p[1], sigmoid(0.8));
}

TEST(QueryProbabilities, AreTheGraphsOwnCosinesOfTheQueriesSetWhereItScoresThemItself) {
  // A graph fused for 3 queries, 2 of them set: the third column (a zero row's cosine) is not a query's.
  FixedStep step({0.6f, 0.8f}, 3, {-0.5f, 0.25f, 0.0f});
  const auto& embedding = step.step({});
  const auto p = sdqes::query_probabilities(step, embedding, two_queries());
  ASSERT_EQ(p.size(), 2u);
  EXPECT_FLOAT_EQ(p[0], sigmoid(-0.5));  // not the embedding's 0.6: the graph's number
  EXPECT_FLOAT_EQ(p[1], sigmoid(0.25));
}

TEST(QueryProbabilities, OfAStreamAreItsOwnRowOfTheEmbeddingsOrOfTheGraphsCosines) {
  // Two streams: stream 1's embedding is (0, 1), its cosines (0.5, -0.25) of a graph fused for 3 queries.
  FixedStep unfused({0.6f, 0.8f, 0.0f, 1.0f}, 0, {});
  const auto p = sdqes::query_probabilities(unfused, unfused.step({}), two_queries(), 1);
  EXPECT_FLOAT_EQ(p[0], sigmoid(0.0));
  EXPECT_FLOAT_EQ(p[1], sigmoid(1.0));
  FixedStep fused({0.6f, 0.8f, 0.0f, 1.0f}, 3, {-0.5f, 0.25f, 0.0f, 0.5f, -0.25f, 0.0f});
  const auto q = sdqes::query_probabilities(fused, fused.step({}), two_queries(), 1);
  EXPECT_FLOAT_EQ(q[0], sigmoid(0.5));
  EXPECT_FLOAT_EQ(q[1], sigmoid(-0.25));
}

TEST(StreamBytes, EachStreamIsOneContiguousBlockOfAStateTensorInStreamOrder) {
  // 3 streams of a 24-byte tensor: 8 bytes each, stream-major ([B*L, ...] rows of one stream together).
  const auto last = sdqes::stream_bytes(24, 3, 2);
  EXPECT_EQ(last.offset, 16u);
  EXPECT_EQ(last.size, 8u);
  EXPECT_EQ(sdqes::stream_bytes(24, 1, 0).size, 24u);
  for (const int outside : {-1, 3}) {
    try {
      (void)sdqes::stream_bytes(24, 3, outside);
      FAIL() << "stream " << outside << " of 3 was taken";
    } catch (const sdqes::Error& e) {
      EXPECT_EQ(std::string(e.what()),
                "stream " + std::to_string(outside) + " is out of range: the step graph steps 3 streams, 0 to 2");
    }
  }
  try {
    (void)sdqes::stream_bytes(24, 1, 1);
    FAIL() << "stream 1 of a one-stream graph was taken";
  } catch (const sdqes::Error& e) {
    EXPECT_EQ(std::string(e.what()), "stream 1 is out of range: the step graph steps one stream, 0");
  }
}

TEST(StepBackend, AGraphThatLeavesScoringToItsCallerTakesNoQueriesAndGivesNoCosines) {
  FixedStep step({0.6f, 0.8f}, 0, {});
  EXPECT_EQ(step.query_rows(), 0);
  EXPECT_THROW(step.set_queries({1.0f, 0.0f}), std::logic_error);
  EXPECT_THROW((void)step.cosines(), std::logic_error);
}

TEST(OpenStep, ABackendThatDoesNotExistIsRefusedInOneLineNamingTheTwoThatDo) {
  sdqes::Bundle bundle;
  try {
    (void)sdqes::open_step(bundle, two_queries(), "cuda", "fp32");
    FAIL() << "opened a step on a backend that does not exist";
  } catch (const sdqes::Error& e) {
    EXPECT_EQ(std::string(e.what()), "backend cuda is not one of tensorrt, onnxruntime");
  }
}

TEST(OpenStep, TheDefaultBackendIsOneThisBuildKnows) {
  const std::string backend = sdqes::default_backend();
  EXPECT_TRUE(backend == "tensorrt" || backend == "onnxruntime") << backend;
#if defined(SDQES_WITH_ONNXRUNTIME) && !defined(SDQES_WITH_TENSORRT)
  EXPECT_EQ(backend, "onnxruntime");  // the only one built
#endif
}

TEST(OpenStep, ThreadsAboveTheCoresThisProcessMayUseAreBroughtDownToThem) {
  // 100,000 threads asked of sdqes_step_open exhausted the process's threads inside ONNX Runtime.
  const int cores = sdqes::usable_cores();
  ASSERT_GE(cores, 1);
  EXPECT_EQ(sdqes::threads_within_cores(100000), cores);
  EXPECT_EQ(sdqes::threads_within_cores(cores), cores);
  EXPECT_EQ(sdqes::threads_within_cores(1), 1);
  EXPECT_EQ(sdqes::threads_within_cores(0), 0);  // ONNX Runtime's own default, one per core
}
