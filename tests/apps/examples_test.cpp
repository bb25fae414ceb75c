// The examples: registry, layer specs and their shapes, data, tied embedding, a few steps.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "apps/data/fashion_mnist.h"
#include "apps/examples/example.h"
#include "apps/examples/reference_trainer.h"
#include "data_test_util.h"
#include "pipetrain/error.h"
#include "pipetrain/util/malloc_tuning.h"

namespace pipetrain::examples {
namespace {

using ::testing::HasSubstr;

bool have_fashion_mnist() {
  try {
    data::check_fashion_mnist();
    return true;
  } catch (const DataError&) {
    return false;
  }
}

#define REQUIRE_FASHION_MNIST() \
  if (!have_fashion_mnist()) GTEST_SKIP() << "dataset-fashion-mnist is not installed"

class Examples : public ::testing::Test {
 protected:
  void SetUp() override {
    torch::set_num_threads(1);
    util::tune_malloc_for_training();
  }
};

TEST_F(Examples, RegistryNamesAndErrors) {
  EXPECT_EQ(example_names(), (std::vector<std::string>{"cnn", "gpt", "mlp", "resnet"}));
  EXPECT_STREQ(default_example(), "cnn");
  try {
    make_example("vgg");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("unknown example 'vgg'; expected one of: cnn, gpt, mlp, resnet"));
  }
  EXPECT_THROW(make_example("mlp", ExampleOptions().replicas(0)), ConfigError);
  EXPECT_THROW(make_example("mlp", ExampleOptions().micro_batches(-1)), ConfigError);
  EXPECT_THROW(make_example("cnn", ExampleOptions().data_dir("/nonexistent")), DataError);
}

TEST_F(Examples, CnnShapesAndData) {
  REQUIRE_FASHION_MNIST();
  const Example ex = make_example("cnn", ExampleOptions().replicas(2).micro_batches(4).eval_samples(1000));
  EXPECT_EQ(ex.layers.size(), 12u);
  EXPECT_EQ(ex.steps_per_epoch, 30000 / 128);
  EXPECT_EQ(ex.defaults.steps, 2 * ex.steps_per_epoch);
  const EngineConfig config = ex.engine_config();
  EXPECT_EQ(config.train_batch_size, 256);
  EXPECT_EQ(config.optimizer.type, "Adam");

  // The micro-batches of one step are disjoint across replicas and micro-batches; the same
  // call gives the same rows.
  const MicroBatch a = ex.train_micro_batch(5, 0, 1);
  EXPECT_EQ(a.inputs.tensor().sizes(), (std::vector<int64_t>{32, 1, 28, 28}));
  EXPECT_EQ(a.labels.tensor().dtype(), torch::kInt64);
  EXPECT_TRUE(torch::equal(a.inputs.tensor(), ex.train_micro_batch(5, 0, 1).inputs.tensor()));
  EXPECT_FALSE(torch::equal(a.inputs.tensor(), ex.train_micro_batch(5, 1, 1).inputs.tensor()));
  EXPECT_THROW(ex.train_micro_batch(0, 2, 0), ConfigError);
  EXPECT_THROW(ex.train_micro_batch(0, 0, 4), ConfigError);

  int64_t eval_rows = 0;
  for (int64_t r = 0; r < 2; ++r) {
    auto it = ex.eval_iterator(r);
    while (auto mb = it->next()) eval_rows += mb->labels.rows();
  }
  EXPECT_EQ(eval_rows, 1000);

  BuiltLayers model = build_model(ex, 1);
  const Batch out = model.forward(a.inputs);
  EXPECT_EQ(out.tensor().sizes(), (std::vector<int64_t>{32, 10}));
  EXPECT_EQ(ex.loss(out, a.labels).dim(), 0);
  const MetricSum m = ex.metric.measure(out, a.labels);
  EXPECT_EQ(m.count, 32);
  EXPECT_GE(m.sum, 0);
}

// 25 reference steps of a Fashion-MNIST classifier: the first loss near ln 10 (within
// `first_tolerance`), the last five 0.7 lower, better than 50% accuracy after 25 x 128 samples.
void expect_classifier_learns(const Example& ex, double first_tolerance) {
  const auto r = train_reference(ex, ex.engine_config(), ReferenceOptions().steps(25));
  ASSERT_EQ(r.losses.size(), 25u);
  EXPECT_NEAR(r.losses[0], std::log(10.0), first_tolerance);
  double tail = 0;
  for (int i = 20; i < 25; ++i) tail += r.losses[i] / 5;
  EXPECT_LT(tail, r.losses[0] - 0.7);
  EXPECT_GT(r.metric, 0.5);
  EXPECT_EQ(r.samples, 25 * 128);
}

TEST_F(Examples, CnnLossFallsInAFewSteps) {
  REQUIRE_FASHION_MNIST();
  const Example ex = make_example("cnn", ExampleOptions().eval_samples(500));
  expect_classifier_learns(ex, 0.5);
}

TEST_F(Examples, ResnetSkipsCrossStagesAndLossFalls) {
  REQUIRE_FASHION_MNIST();
  const Example ex = make_example("resnet", ExampleOptions().eval_samples(500));
  ASSERT_EQ(ex.layers.size(), 30u);
  const auto plan = skip_plan(ex.layers);
  ASSERT_EQ(plan.routes().size(), 3u);  // stem -> head, and one per residual block
  EXPECT_EQ(plan.routes()[0].key.name, "stem");
  EXPECT_EQ(plan.routes()[0].stash_layer, 3);
  EXPECT_EQ(plan.routes()[0].pop_layer, 25);
  // Uniform thirds cut both block skips' neighbourhoods; the stem skip jumps over stage 1.
  EXPECT_EQ(plan.stashes_out(0, 10).size(), 2u);
  EXPECT_EQ(plan.pops_in(20, 30).size(), 2u);

  expect_classifier_learns(ex, 0.7);
}

TEST_F(Examples, GptShapesAndTiedEmbedding) {
  const Example ex = make_example("gpt", ExampleOptions().micro_batch_size(3).eval_samples(10));
  const size_t n = ex.layers.size();
  ASSERT_GE(n, 5u);
  EXPECT_TRUE(ex.layers.front().tied());
  EXPECT_TRUE(ex.layers.back().tied());
  EXPECT_EQ(ex.layers.front().tied_key, ex.layers.back().tied_key);
  for (size_t i = 1; i + 1 < n; ++i) EXPECT_FALSE(ex.layers[i].tied()) << i;

  BuiltLayers model = build_model(ex, 3);
  // One module at both ends, its parameters counted once.
  EXPECT_EQ(model.modules.front().ptr().get(), model.modules.back().ptr().get());
  std::set<const void*> unique;
  for (const auto& p : model.parameters()) EXPECT_TRUE(unique.insert(p.data_ptr()).second);

  const MicroBatch mb = ex.train_micro_batch(0, 0, 0);
  EXPECT_EQ(mb.inputs.tensor().dtype(), torch::kInt64);
  EXPECT_TRUE(torch::equal(mb.inputs.tensor().slice(1, 1), mb.labels.tensor().slice(1, 0, -1)));
  const auto logits = model.forward(mb.inputs).tensor();
  const int64_t T = mb.inputs.tensor().size(1);
  const auto weight = model.modules.front().get<torch::nn::Embedding>()->weight;
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, T, weight.size(0)}));

  // The gradient of the shared weight gets contributions from both uses.
  ex.loss(Batch(logits), mb.labels).backward();
  const auto grad = weight.grad().clone();
  const auto used =
      torch::zeros({weight.size(0)}, torch::kBool).index_put_({mb.inputs.tensor().view(-1)}, true);
  EXPECT_GT(grad.index({~used}).abs().sum().item<double>(), 0)  // only via the output projection
      << "rows of tokens absent from the input got no gradient";

  // A stage holding only the last layers builds its own copy of the embedding.
  BuiltLayers tail = build_layers(ex.layers, static_cast<int64_t>(n) - 2, static_cast<int64_t>(n));
  EXPECT_EQ(tail.modules.size(), 2u);
  EXPECT_EQ(tail.modules[1].get<torch::nn::Embedding>()->weight.sizes(), weight.sizes());
}

TEST_F(Examples, GptLossFallsAndSamples) {
  const Example ex =
      make_example("gpt", ExampleOptions().micro_batch_size(8).micro_batches(2).eval_samples(16));
  EngineConfig config = ex.engine_config();
  config.scheduler.type = "";
  config.optimizer.lr = 3e-3;
  BuiltLayers model;
  const auto r =
      train_reference(ex, config, ReferenceOptions().steps(30).sample_length(40), nullptr, &model);
  EXPECT_NEAR(r.losses[0],
              std::log(static_cast<double>(
                  model.modules.front().get<torch::nn::Embedding>()->weight.size(0))),
              0.3);
  EXPECT_LT(r.losses.back(), r.losses[0] - 1.0);
  EXPECT_EQ(r.metric_name, "val_loss");
  EXPECT_LT(r.metric, r.losses[0]);
  EXPECT_EQ(r.sample.size(), 40u);
  // Sampling is reproducible from its seed; greedy decoding too.
  EXPECT_EQ(ex.sample(model, SampleOptions().length(30).seed(5)),
            ex.sample(model, SampleOptions().length(30).seed(5)));
  EXPECT_EQ(ex.sample(model, SampleOptions().length(20).temperature(0).prompt("The ")).size(), 20u);
  EXPECT_THROW(ex.sample(model, SampleOptions().prompt(std::string(1, '\x01'))), DataError);
}

TEST_F(Examples, MlpShapesIteratorAndConfig) {
  const Example ex = make_example("mlp");
  EXPECT_EQ(ex.layers.size(), 32u);
  EXPECT_EQ(ex.layers[30].type, "Linear");
  EXPECT_EQ(ex.layers[31].type, "ReLU");
  const EngineConfig config = ex.engine_config();
  EXPECT_EQ(config.train_batch_size, 256);
  EXPECT_EQ(config.gradient_accumulation_steps, 8);
  EXPECT_EQ(config.optimizer.type, "SGD");
  EXPECT_DOUBLE_EQ(config.optimizer.lr, 0.01);

  // Layer weights do not depend on the seeding (WORKLOADS.md's weights on every stage).
  BuiltLayers tail = build_layers(ex.layers, 30, 32, [](int64_t) { torch::manual_seed(77); });
  EXPECT_NEAR(tail.modules[0].get<torch::nn::Linear>()->weight.sum().item<double>(), -7.232272,
              1e-4);
  EXPECT_EQ(tail.forward(ex.train_micro_batch(0, 0, 0).inputs).tensor().sizes(),
            (std::vector<int64_t>{32, 1024}));

  auto it = ex.train_iterator(0, 2, 2);
  int count = 0;
  while (it->next()) ++count;
  EXPECT_EQ(count, 16);
}

TEST_F(Examples, ReplicasAccumulateLikeOneLargerStep) {
  // mlp: 2 replicas x 4 micro-batches take the same 8 slices of 32 rows as 1 x 8, so the
  // reference trainer's replica accumulation (the engine's all-reduce mean) gives the same run.
  const Example one = make_example("mlp");
  const Example two = make_example("mlp", ExampleOptions().replicas(2).micro_batches(4));
  EXPECT_TRUE(torch::equal(two.train_micro_batch(0, 1, 0).inputs.tensor(),
                           one.train_micro_batch(0, 0, 4).inputs.tensor()));
  EngineConfig config = one.engine_config();
  config.optimizer.lr = 5.0;  // large enough for the loss to move visibly
  EngineConfig config_two = two.engine_config();
  config_two.optimizer = config.optimizer;
  const auto a = train_reference(one, config, ReferenceOptions().steps(3).evaluate(false));
  const auto b = train_reference(two, config_two, ReferenceOptions().steps(3).evaluate(false));
  EXPECT_EQ(b.samples, a.samples);
  EXPECT_LT(a.losses[2], a.losses[0] - 1e-4);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(a.losses[i], b.losses[i], 1e-6) << "step " << i;
}

TEST_F(Examples, ReplicasShareTheExamplesStepAsDeepSpeedKeepsTrainBatchSize) {
  // Without --micro-batches, 2 replicas take half of gpt's 4 micro-batches each, and replica 1's
  // first is the one-process run's third: the same global batch, so the same training.
  const Example one = make_example("gpt");
  const Example two = make_example("gpt", ExampleOptions().replicas(2));
  EXPECT_EQ(two.defaults.micro_batches, one.defaults.micro_batches / 2);
  EXPECT_EQ(two.engine_config().train_batch_size, one.engine_config().train_batch_size);
  EXPECT_TRUE(torch::equal(two.train_micro_batch(5, 1, 0).inputs.tensor(),
                           one.train_micro_batch(5, 0, 2).inputs.tensor()));
  EXPECT_FALSE(torch::equal(two.train_micro_batch(5, 1, 0).inputs.tensor(),
                            one.train_micro_batch(5, 0, 0).inputs.tensor()));
  // Where they do not divide it, each replica takes the example's micro-batches; an explicit
  // count is per replica.
  EXPECT_EQ(make_example("gpt", ExampleOptions().replicas(3)).defaults.micro_batches, 4);
  EXPECT_EQ(make_example("gpt", ExampleOptions().replicas(2).micro_batches(4)).defaults.micro_batches, 4);
}

TEST_F(Examples, ConfigFileKeysOverrideTheDefaults) {
  const Example ex = make_example("mlp");
  const auto dir = pipetrain::testing::scratch_dir("example_config");
  std::ofstream(dir + "/c.json")
      << R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.5}}, "seed": 9})";
  const EngineConfig c = example_config(ex, dir + "/c.json");
  EXPECT_EQ(c.optimizer.type, "AdamW");
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.5);
  EXPECT_EQ(c.seed, 9u);
  EXPECT_EQ(c.gradient_accumulation_steps, 8);  // kept from the example
  std::ofstream(dir + "/b.json")
      << R"({"train_micro_batch_size_per_gpu": 16, "train_batch_size": 256})";
  const EngineConfig b = example_config(ex, dir + "/b.json");
  EXPECT_EQ(b.gradient_accumulation_steps, 16);
  // The trainer refuses batch sizes the example's data was not made for.
  EXPECT_THROW(train_reference(ex, b, ReferenceOptions().steps(1)), ConfigError);
  EXPECT_THROW(example_config(ex, dir + "/missing.json"), ConfigError);
}

// A DeepSpeed user's file: "auto" keeps the example's values (as an absent key does), the
// precision, ZeRO and TensorBoard blocks carry over, and the warnings come along.
TEST_F(Examples, ConfigFileAutoKeepsTheExamplesValuesAndDeepSpeedBlocksCarryOver) {
  const Example ex = make_example("mlp");
  const EngineConfig plain = ex.engine_config();
  const auto dir = pipetrain::testing::scratch_dir("example_config_auto");
  std::ofstream(dir + "/ds.json") << R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
      "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "prescale_gradients": false,
      "bf16": {"enabled": true}, "zero_optimization": {"stage": 0},
      "tensorboard": {"enabled": true, "output_path": "/tmp/tb", "job_name": "mlp"}})";
  const EngineConfig c = example_config(ex, dir + "/ds.json", ConfigWarnings::Collect);
  EXPECT_EQ(c.train_batch_size, plain.train_batch_size);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, plain.train_micro_batch_size_per_gpu);
  EXPECT_EQ(c.gradient_accumulation_steps, plain.gradient_accumulation_steps);
  EXPECT_DOUBLE_EQ(c.gradient_clipping, plain.gradient_clipping);
  EXPECT_EQ(c.precision(), "bf16");
  EXPECT_EQ(c.zero_optimization.stage, 0);
  EXPECT_TRUE(c.tensorboard.enabled);
  EXPECT_EQ(c.tensorboard.job_name, "mlp");
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_NE(c.warnings[0].find("\"prescale_gradients\""), std::string::npos) << c.warnings[0];
}

}  // namespace
}  // namespace pipetrain::examples
