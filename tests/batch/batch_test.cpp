// Batch values and calling a layer with the right forward signature.
#include "pipetrain/batch/batch.h"

#include <gtest/gtest.h>

#include "pipetrain/error.h"

namespace pipetrain {
namespace {

struct PairSumImpl : torch::nn::Module {
  std::vector<torch::Tensor> forward(std::vector<torch::Tensor> xs) { return {xs[0] + xs[1], xs[1]}; }
};
TORCH_MODULE(PairSum);

TEST(Batch, AtomicAndTupleForms) {
  Batch a(torch::ones({3, 2}));
  EXPECT_TRUE(a.atomic());
  EXPECT_EQ(a.rows(), 3);
  Batch t(std::vector<torch::Tensor>{torch::ones({4, 2}), torch::zeros({4}, torch::kBool)});
  EXPECT_FALSE(t.atomic());
  EXPECT_EQ(t.size(), 2u);
  EXPECT_THROW(t.tensor(), BatchError);
  EXPECT_EQ(t.describe(), "(Tensor[4, 2] Float, Tensor[4] Bool)");
}

TEST(Batch, RejectsUndefinedTensors) {
  try {
    Batch b(std::vector<torch::Tensor>{torch::ones({1}), torch::Tensor()});
    FAIL() << "no error";
  } catch (const BatchError& e) {
    EXPECT_NE(std::string(e.what()).find("batch value 1"), std::string::npos) << e.what();
  }
}

// Skip links carry none where an optional skip stashed nothing; only tuple_with_none holds it.
TEST(Batch, TupleWithNone) {
  Batch b = Batch::tuple_with_none({torch::Tensor(), torch::ones({3, 2})});
  EXPECT_FALSE(b.atomic());
  EXPECT_FALSE(b[0].defined());
  EXPECT_EQ(b.rows(), 3);
  EXPECT_EQ(b.describe(), "(undefined tensor, Tensor[3, 2] Float)");
  // with() keeps the kind, so detaching or moving the values keeps the none.
  Batch same = b.with({torch::Tensor(), torch::zeros({3, 2})});
  EXPECT_FALSE(same[0].defined());
  EXPECT_EQ(Batch::tuple_with_none({torch::Tensor()}).rows(), 0);
  EXPECT_THROW(Batch::tuple({torch::Tensor()}), BatchError);
}

TEST(Batch, CallLayerPicksTheSignature) {
  torch::nn::AnyModule linear(torch::nn::Linear(2, 3));
  EXPECT_EQ(call_layer(linear, Batch(torch::ones({5, 2}))).tensor().sizes(), (std::vector<int64_t>{5, 3}));
  torch::nn::AnyModule pair(PairSum{});
  Batch out = call_layer(pair, Batch(std::vector<torch::Tensor>{torch::ones({2}), torch::ones({2})}));
  EXPECT_FALSE(out.atomic());
  EXPECT_TRUE(torch::equal(out[0], torch::full({2}, 2.0)));
}

TEST(Batch, CallLayerNamesAMismatchedSignature) {
  torch::nn::AnyModule linear(torch::nn::Linear(2, 3));
  try {
    call_layer(linear, Batch(std::vector<torch::Tensor>{torch::ones({1, 2}), torch::ones({1, 2})}), 7);
    FAIL() << "no error";
  } catch (const BatchError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("layer 7"), std::string::npos) << what;
    EXPECT_NE(what.find("Linear"), std::string::npos) << what;
    EXPECT_NE(what.find("std::vector<torch::Tensor>"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace pipetrain
