// The Chrome trace and SVG renderers, and the text and JSON forms of a schedule.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "pipetrain/schedule/format.h"
#include "pipetrain/schedule/generate.h"
#include "pipetrain/schedule/simulate.h"
#include "pipetrain/schedule/svg.h"
#include "pipetrain/schedule/trace.h"

namespace pipetrain::schedule {
namespace {

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

TEST(ChromeTrace, OneCompleteEventPerTimedActionAndOneThreadPerRow) {
  const Schedule s = generate(ScheduleOptions(ScheduleKind::one_f_one_b, 2, 3));
  const auto r = simulate(s, CostModel::uniform(2, 1, 1, 1, 0.5));
  const auto json = nlohmann::json::parse(render_chrome_trace(r.events()));
  EXPECT_EQ(json["displayTimeUnit"], "ms");
  int complete = 0, instant = 0, threads = 0;
  for (const auto& e : json["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") {
      ++threads;
      EXPECT_EQ(e["args"]["name"], "stage " + std::to_string(e["tid"].get<int>()));
    }
    if (e["ph"] == "i") ++instant;
    if (e["ph"] != "X") continue;
    ++complete;
    if (e["name"] == "B1" && e["tid"] == 0) {
      EXPECT_EQ(e["cat"], "backward");
      EXPECT_EQ(e["args"]["mb"], 1);
      EXPECT_EQ(e["args"]["chunk"], 0);
      EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 2000.0);  // 2 units at 1000 us each
    }
  }
  EXPECT_EQ(threads, 2);
  // Compute steps (12) and receives that waited (stage 1's first, stage 0's gradients) have a
  // duration; sends, loads and step actions are instants.
  EXPECT_GE(complete, 12);
  EXPECT_EQ(complete + instant, static_cast<int>(s.num_actions()));
}

TEST(ChromeTrace, MeasuredEventsInSecondsNamedByRank) {
  TraceOptions options;
  options.microseconds_per_unit = 1e6;
  options.row_name = "rank";
  const auto json = nlohmann::json::parse(
      render_chrome_trace({{3, Op::backward_weight, 7, 1, 0.5, 0.75}}, options));
  const auto& events = json["traceEvents"];
  EXPECT_EQ(events[events.size() - 1]["name"], "W7c1");
  EXPECT_DOUBLE_EQ(events[events.size() - 1]["ts"].get<double>(), 500000.0);
  EXPECT_DOUBLE_EQ(events[events.size() - 1]["dur"].get<double>(), 250000.0);
  bool named = false;
  for (const auto& e : events)
    named = named || (e["name"] == "thread_name" && e["args"]["name"] == "rank 3");
  EXPECT_TRUE(named);
}

TEST(Svg, RowsBoxesLabelsLegendAndTitle) {
  const Schedule s = generate(ScheduleOptions(ScheduleKind::zb_h1, 4, 8));
  const auto r = simulate(s, CostModel::uniform(4, 1, 1, 1, 0));
  SvgOptions options;
  options.title = timeline_title(s, r.bubble_overall);
  const std::string svg = render_svg(r.events(), options);
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(svg.find("zb-h1: P=4 stages, M=8 micro-batches, V=1, bubble 11.1%"), std::string::npos);
  EXPECT_EQ(count(svg, "class=\"idle\""), 4u);  // one grey row per stage: idle shows through
  EXPECT_EQ(count(svg, "<g class=\"forward\">"), 32u);
  EXPECT_EQ(count(svg, "<g class=\"backward_input\">"), 32u);
  EXPECT_EQ(count(svg, "<g class=\"backward_weight\">"), 32u);
  EXPECT_EQ(count(svg, "<g class=\"backward\">"), 0u);
  EXPECT_NE(svg.find("<title>stage 2: forward micro-batch 5, "), std::string::npos);
  // Micro-batch ids are drawn in the boxes (96 boxes, each wide enough).
  EXPECT_EQ(count(svg, "class=\"label\""), 96u);
  for (const char* legend :
       {">forward</text>", ">backward_input</text>", ">backward_weight</text>", ">idle</text>"})
    EXPECT_NE(svg.find(legend), std::string::npos) << legend;
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
}

TEST(Svg, LaterChunksAreLighterAndTitlesAreEscaped) {
  const std::vector<TimedEvent> events = {{0, Op::forward, 0, 0, 0, 1},
                                          {0, Op::forward, 0, 1, 1, 2}};
  SvgOptions options;
  options.title = "a < b & c";
  const std::string svg = render_svg(events, options);
  EXPECT_NE(svg.find("a &lt; b &amp; c"), std::string::npos);
  EXPECT_NE(svg.find("fill=\"#4e79a7\""), std::string::npos);  // chunk 0
  EXPECT_NE(svg.find("fill=\"#a7bcd3\""), std::string::npos);  // chunk 1, half-way to white
  EXPECT_NE(svg.find("lighter shade = later chunk"), std::string::npos);
}

TEST(Svg, NarrowBoxesKeepTheirTooltipButDropTheLabel) {
  std::vector<TimedEvent> events;
  for (int i = 0; i < 400; ++i) events.push_back({0, Op::forward, i, 0, double(i), i + 1.0});
  const std::string svg = render_svg(events);
  EXPECT_EQ(count(svg, "<title>"), 400u);
  EXPECT_EQ(count(svg, "class=\"label\""), 0u);
}

TEST(Format, JsonHasOneArrayPerStageWithOpMbAndChunk) {
  const Schedule s = generate(ScheduleOptions(ScheduleKind::zb_v, 2, 2));
  const auto json = nlohmann::json::parse(to_json(s));
  EXPECT_EQ(json["kind"], "zb-v");
  EXPECT_EQ(json["layout"], "v_shape");
  EXPECT_EQ(json["virtual_stages"], nlohmann::json::parse("[[0, 3], [1, 2]]"));
  ASSERT_EQ(json["stages"].size(), 2u);
  ASSERT_EQ(json["stages"][0].size(), s.stages[0].size());
  for (size_t j = 0; j < 2; ++j) {
    for (size_t k = 0; k < s.stages[j].size(); ++k) {
      const auto& a = json["stages"][j][k];
      const Action& b = s.stages[j][k];
      EXPECT_EQ(a["op"], op_name(b.op));
      EXPECT_EQ(a["chunk"], b.chunk);
      EXPECT_EQ(a.contains("mb"), has_micro_batch(b.op));
      EXPECT_EQ(a.contains("peer_stage"), is_comm(b.op));
      if (has_micro_batch(b.op)) {
        EXPECT_EQ(a["mb"], b.micro_batch);
      }
    }
  }
  EXPECT_EQ(nlohmann::json::parse(to_json(s, -1, false)), json);
  const auto only = nlohmann::json::parse(to_json(s, 1));
  EXPECT_EQ(only["selected_stage"], 1);
  EXPECT_TRUE(only["stages"][0].empty());
  EXPECT_EQ(only["stages"][1].size(), s.stages[1].size());
}

TEST(Format, TextListsOneLinePerStage) {
  const Schedule s = generate(ScheduleOptions(ScheduleKind::inference, 3, 2));
  const std::string text = format_text(s);
  EXPECT_EQ(count(text, "\nstage "), 3u);
  EXPECT_EQ(text.substr(0, text.find('\n')),
            "inference: 3 stages, 2 micro-batches, 1 chunk(s) per stage (looped layout); buffers "
            "per stage: 1 1 1");
  EXPECT_EQ(count(format_text(s, 2), "\nstage "), 1u);
  EXPECT_TRUE(std::regex_search(format_text(s, 2), std::regex("\nstage 2: 2RA0#0<1 ")));
}

}  // namespace
}  // namespace pipetrain::schedule
