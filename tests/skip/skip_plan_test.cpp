// Skip declarations: checking, namespaces, ranges, and skippable layers outside a pipeline.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "pipetrain/error.h"
#include "pipetrain/skip/plan.h"
#include "pipetrain/skip/skippable.h"

namespace pipetrain::skip {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

SkipDeclaration decl(std::vector<std::string> stash, std::vector<std::string> pop) {
  return SkipDeclaration::of(stash, pop);
}

std::string plan_error(const std::vector<SkipDeclaration>& layers) {
  std::vector<std::string> names;
  for (size_t i = 0; i < layers.size(); ++i) names.push_back("L" + std::to_string(i));
  try {
    SkipPlan plan(layers, names);
  } catch (const ModuleError& e) {
    return e.what();
  }
  return "";
}

TEST(SkipPlan, RoutesEachKeyFromStashToPop) {
  // 0 stash(a)  1  2 stash(b)  3 pop(b)  4  5 pop(a)
  SkipPlan plan({decl({"a"}, {}), {}, decl({"b"}, {}), decl({}, {"b"}), {}, decl({}, {"a"})}, {});
  ASSERT_EQ(plan.routes().size(), 2u);
  EXPECT_EQ(plan.routes()[0].key.name, "a");
  EXPECT_EQ(plan.routes()[0].stash_layer, 0);
  EXPECT_EQ(plan.routes()[0].pop_layer, 5);
  EXPECT_EQ(plan.routes()[1].stash_layer, 2);
  EXPECT_EQ(plan.routes()[1].pop_layer, 3);

  EXPECT_TRUE(plan.pops_in(2, 4).empty());  // b stays inside
  EXPECT_TRUE(plan.stashes_out(2, 4).empty());
  ASSERT_EQ(plan.stashes_out(0, 2).size(), 1u);
  EXPECT_EQ(plan.stashes_out(0, 2)[0].key.name, "a");
  ASSERT_EQ(plan.pops_in(4, 6).size(), 1u);
  EXPECT_EQ(plan.pops_in(4, 6)[0].key.name, "a");
  // A range that cuts both skips.
  EXPECT_EQ(plan.stashes_out(0, 3).size(), 2u);
  EXPECT_EQ(plan.pops_in(3, 6).size(), 2u);
  EXPECT_EQ(plan.pops_in(3, 6)[0].key.name, "b");  // by pop layer
}

TEST(SkipPlan, BadDeclarationsNameTheSkipAndTheLayers) {
  EXPECT_THAT(plan_error({{}, decl({}, {"x"})}),
              AllOf(HasSubstr("layer 1 (L1) pops skip 'x'"), HasSubstr("no layer stashes it")));
  EXPECT_THAT(plan_error({decl({}, {"x"}), decl({"x"}, {})}),
              AllOf(HasSubstr("layer 0 (L0) pops skip 'x' before layer 1 (L1) stashes it")));
  EXPECT_THAT(plan_error({decl({"x"}, {}), decl({"x"}, {}), decl({}, {"x"})}),
              AllOf(HasSubstr("skip 'x' is stashed by layer 0 (L0) and again by layer 1 (L1)"),
                    HasSubstr("Namespace")));
  EXPECT_THAT(plan_error({decl({"x"}, {}), decl({}, {"x"}), decl({}, {"x"})}),
              HasSubstr("skip 'x' is popped by layer 1 (L1) and again by layer 2 (L2)"));
  EXPECT_THAT(plan_error({decl({"x"}, {}), {}}),
              AllOf(HasSubstr("layer 0 (L0) stashes skip 'x' but no later layer pops it")));
  EXPECT_THAT(plan_error({decl({"x"}, {"x"})}), HasSubstr("both stashes and pops skip 'x'"));
  EXPECT_THAT(plan_error({decl({"x"}, {}), decl({}, {"x", "x"})}), HasSubstr("declares the pop of skip 'x' twice"));
  EXPECT_EQ(plan_error({decl({"x"}, {}), decl({}, {"x"})}), "");
}

TEST(SkipPlan, NamespacesLetARepeatedBlockReuseItsNames) {
  Namespace first, second("block2");
  const auto block = [](const Namespace& ns) {
    return std::vector<SkipDeclaration>{decl({"x"}, {}).isolated(ns), {}, decl({}, {"x"}).isolated(ns)};
  };
  std::vector<SkipDeclaration> model = block(first);
  for (const auto& d : block(second)) model.push_back(d);
  SkipPlan plan(model, {});
  ASSERT_EQ(plan.routes().size(), 2u);
  EXPECT_EQ(plan.routes()[1].key.ns, "block2");
  EXPECT_EQ(plan.routes()[1].stash_layer, 3);
  EXPECT_EQ(plan.routes()[1].pop_layer, 5);

  // The same block twice without namespaces: the second stash is a duplicate.
  std::vector<SkipDeclaration> flat = {decl({"x"}, {}), {}, decl({}, {"x"}), decl({"x"}, {}), {}, decl({}, {"x"})};
  EXPECT_THAT(plan_error(flat), HasSubstr("stashed by layer 0 (L0) and again by layer 3 (L3)"));
  // A pop in another namespace does not match.
  EXPECT_THAT(plan_error({decl({"x"}, {}).isolated(first), decl({}, {"x"})}), HasSubstr("no layer stashes it"));
  EXPECT_THROW(Namespace(""), ModuleError);
}

TEST(Skippable, RunsAsAPlainSequential) {
  torch::nn::Sequential model(stash("a"), torch::nn::Linear(3, 3), pop_add("a"), stash("b"), pop_cat("b", 1));
  auto x = torch::randn({2, 3});
  auto y = model->forward(x);
  torch::NoGradGuard no_grad;
  auto expected_sum = model[1]->as<torch::nn::Linear>()->forward(x) + x;
  EXPECT_TRUE(torch::allclose(y, torch::cat({expected_sum, expected_sum}, 1)));
  EXPECT_EQ(current_tracker().size(), 0u) << "every stash was popped";
}

// torchgpipe's None: a layer may stash an undefined tensor, and the popping layer decides.
TEST(Skippable, OptionalSkipsPassThroughAPlainSequential) {
  auto present = std::make_shared<bool>(true);
  Skippable maybe(std::vector<std::string>{"a"}, std::vector<std::string>{},
                  [present](const torch::Tensor& x, Skips& s) {
                    s.stash("a", *present ? x * 3 : torch::Tensor());
                    return x;
                  }, "Maybe");
  torch::nn::Linear linear(3, 3);
  torch::nn::Sequential model(maybe, linear, pop_add("a"));
  const auto x = torch::randn({2, 3});
  for (bool defined : {true, false, true}) {
    *present = defined;
    const auto y = model->forward(x);
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(torch::allclose(y, defined ? linear(x) + x * 3 : linear(x))) << "stashed " << defined;
    EXPECT_EQ(current_tracker().size(), 0u);
  }
  // Gradients flow where the skip is present and nowhere else.
  auto leaf = x.clone().requires_grad_(true);
  *present = false;
  model->forward(leaf).sum().backward();
  const auto without = leaf.grad().clone();
  leaf.mutable_grad() = torch::Tensor();
  *present = true;
  model->forward(leaf).sum().backward();
  EXPECT_TRUE(torch::allclose(leaf.grad(), without + 3));

  // pop_cat cannot concatenate nothing: that would change the width the next layer sees.
  torch::nn::Sequential cat(maybe, pop_cat("a"));
  *present = false;
  try {
    cat->forward(x);
    FAIL() << "pop_cat of an undefined tensor";
  } catch (const ModuleError& e) {
    EXPECT_THAT(std::string(e.what()), AllOf(HasSubstr("PopCat popped an undefined tensor under skip 'a'"),
                                             HasSubstr("handles the missing one")));
  }
  current_tracker().clear();
}

TEST(Skippable, UndeclaredNamesAreErrors) {
  Skippable liar(std::vector<std::string>{"a"}, std::vector<std::string>{}, [](const torch::Tensor& x, Skips& s) {
    s.stash("b", x);
    return x;
  }, "Liar");
  try {
    liar->forward(torch::ones({1}));
    FAIL() << "stash of an undeclared name";
  } catch (const ModuleError& e) {
    EXPECT_THAT(std::string(e.what()), AllOf(HasSubstr("layer Liar stashes skip 'b'"), HasSubstr("stash [a]")));
  }
  SkipTracker tracker;
  TrackerScope scope(tracker);
  try {
    pop_add("missing")->forward(torch::ones({1}));
    FAIL() << "pop of nothing";
  } catch (const ModuleError& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("skip 'missing' is popped but nothing was stashed"));
  }
}

TEST(Skippable, EveryDeclaredNameMustBeUsedInEachForward) {
  // torchgpipe's rule, checked after the layer's forward in a pipeline or not.
  SkipTracker tracker;
  TrackerScope scope(tracker);
  Skippable lazy(std::vector<std::string>{"a", "b"}, std::vector<std::string>{}, [](const torch::Tensor& x, Skips& s) {
    s.stash("a", x);
    return x;
  }, "Lazy");
  try {
    lazy->forward(torch::ones({1}));
    FAIL() << "a declared stash left out";
  } catch (const ModuleError& e) {
    EXPECT_THAT(std::string(e.what()), AllOf(HasSubstr("'b' must be stashed but have not"), HasSubstr("layer Lazy")));
  }
  tracker.clear();
  Skippable picky(std::vector<std::string>{}, std::vector<std::string>{"a", "b"}, [](const torch::Tensor& x, Skips& s) {
    return x + s.pop("a");
  }, "Picky");
  tracker.stash({"", "a"}, torch::ones({1}));
  tracker.stash({"", "b"}, torch::ones({1}));
  try {
    picky->forward(torch::ones({1}));
    FAIL() << "a declared pop left out";
  } catch (const ModuleError& e) {
    EXPECT_THAT(std::string(e.what()), AllOf(HasSubstr("'b' must be popped but have not"), HasSubstr("layer Picky")));
  }
  EXPECT_EQ(tracker.size(), 0u);  // b does not wait for a later forward
}

TEST(SkipDeclaration, EqualWhateverTheOrderOfItsNames) {
  // Python hands over a set's names in an order PYTHONHASHSEED picks.
  EXPECT_EQ(decl({"a", "b", "c"}, {"x", "y"}), decl({"c", "a", "b"}, {"y", "x"}));
  EXPECT_NE(decl({"a", "b"}, {}), decl({"a"}, {"b"}));
  EXPECT_NE(decl({"a", "b"}, {}), decl({"a", "c"}, {}));
}

TEST(Skippable, TrackerScopesNest) {
  SkipTracker outer, inner;
  TrackerScope a(outer);
  stash("k")->forward(torch::ones({1}));
  {
    TrackerScope b(inner);
    stash("k")->forward(torch::zeros({1}));
  }
  EXPECT_EQ(outer.size(), 1u);
  EXPECT_EQ(inner.size(), 1u);
  EXPECT_EQ(outer.pop({"", "k"}).item<float>(), 1.0f);
}

// A layer hiding a skippable inside it.
struct WrapperImpl : torch::nn::Module {
  WrapperImpl() : inner(register_module("inner", stash("x"))) {}
  torch::Tensor forward(const torch::Tensor& x) { return inner(x); }
  Skippable inner;
};
TORCH_MODULE(Wrapper);

TEST(SkipDeclarations, OnlyDirectChildrenOfTheSequential) {
  torch::nn::Sequential model(torch::nn::Linear(2, 2), Wrapper());
  try {
    declarations_of(model);
    FAIL() << "a nested skippable";
  } catch (const ModuleError& e) {
    EXPECT_THAT(std::string(e.what()), AllOf(HasSubstr("layer 1 holds the skippable Stash"),
                                             HasSubstr("direct children of the Sequential")));
  }
  torch::nn::Sequential flat(stash("x"), torch::nn::Linear(2, 2), pop_add("x"));
  const auto d = declarations_of(flat);
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[0].stash.size(), 1u);
  EXPECT_TRUE(d[1].empty());
  EXPECT_EQ(d[2].pop.size(), 1u);
}

// A skippable with parameters, written as a subclass.
struct GateImpl : SkippableImpl {
  GateImpl() : SkippableImpl({}, {"x"}, "Gate"), w(register_module("w", torch::nn::Linear(3, 3))) {}
  torch::Tensor forward_skips(const torch::Tensor& h, Skips& s) override {
    return h + torch::sigmoid(w(h)) * s.pop("x");
  }
  torch::nn::Linear w;
};

TEST(Skippable, SubclassWithParameters) {
  auto gate = std::make_shared<GateImpl>();
  torch::nn::Sequential model(stash("x"), torch::nn::Tanh(), gate);
  const auto d = declarations_of(model);
  EXPECT_EQ(d[2].pop.size(), 1u);
  auto x = torch::randn({2, 3});
  model->forward(x).sum().backward();
  EXPECT_TRUE(gate->w->weight.grad().defined());
  EXPECT_GT(gate->w->weight.grad().abs().sum().item<double>(), 0.0);
}

TEST(Skippable, ClonesWithItsDeclaration) {
  Namespace ns("n");
  auto s = stash("x");
  s->isolate(ns);
  auto copy = std::dynamic_pointer_cast<SkippableImpl>(s->clone());
  ASSERT_TRUE(copy);
  EXPECT_EQ(copy->declaration(), s->declaration());
  EXPECT_EQ(copy->declaration().stash[0].ns, "n");
}

}  // namespace
}  // namespace pipetrain::skip
