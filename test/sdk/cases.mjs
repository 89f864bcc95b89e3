// The client SDK cases internal/sdktest runs: node cases.mjs BASE_URL
// runs each against BASE_URL (Spillway's, or the mock upstream's) and
// prints one JSON object, {case name: what the client got back}. Each
// prompt carries [case:NAME] so the mock files the bodies it receives
// under the case. Only what the client sees is printed, never ids or
// times that differ between two runs.
import OpenAI from 'openai';
import { zodFunction, zodResponseFormat } from 'openai/helpers/zod';
import { generateText, streamText, Output, tool, isStepCount } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { z } from 'zod';

const [baseURL, only] = process.argv.slice(2);
if (!baseURL) {
  console.error('usage: node cases.mjs BASE_URL [CASE]');
  process.exit(2);
}
const apiKey = process.env.SDK_API_KEY ?? 'sdk-test-key';
const model = 'mock-model';
const timeout = () => AbortSignal.timeout(20000);
// One red pixel, PNG.
const pixel = 'data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==';

const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 20000 });
const openai = createOpenAI({ baseURL, apiKey });
const compat = createOpenAICompatible({ name: 'spillway', baseURL, apiKey, includeUsage: true });

const weatherSchema = z.object({ city: z.string() });
const weather = ({ city }) => ({ city, forecast: 'sunny', celsius: 21 });
const aiTools = { get_weather: tool({ description: 'The weather in a city', inputSchema: weatherSchema, execute: async (a) => weather(a) }) };
const citySchema = z.object({ city: z.string(), temperature: z.number() });

const ask = (name, text) => `[case:${name}] ${text}`;

// aiResult is what an AI SDK run shows its caller.
async function aiResult(r) {
  const steps = await r.steps;
  return {
    text: await r.text,
    reasoning: (await r.reasoningText) ?? '',
    finishReason: await r.finishReason,
    steps: steps.length,
    toolCalls: steps.flatMap((s) => s.toolCalls.map((c) => ({ id: c.toolCallId, name: c.toolName, input: c.input }))),
    toolResults: steps.flatMap((s) => s.toolResults.map((c) => c.output)),
    usage: await r.totalUsage,
  };
}

const cases = {
  // The official openai SDK.
  'openai-chat': async (name) => {
    const r = await client.chat.completions.create({ model, messages: [{ role: 'user', content: ask(name, 'Say hello.') }] }, { signal: timeout() });
    const c = r.choices[0];
    return { content: c.message.content, finish: c.finish_reason, usage: r.usage, model: r.model };
  },
  'openai-chat-stream': async (name) => {
    const s = await client.chat.completions.create({ model, stream: true, stream_options: { include_usage: true },
      messages: [{ role: 'user', content: ask(name, 'Say hello.') }] }, { signal: timeout() });
    let content = '', finish = null, usage = null;
    for await (const ch of s) {
      for (const c of ch.choices) { content += c.delta.content ?? ''; finish = c.finish_reason ?? finish; }
      if (ch.usage) usage = ch.usage;
    }
    return { content, finish, usage };
  },
  'openai-usage-details-stream': async (name) => {
    const s = await client.chat.completions.create({ model, stream: true, stream_options: { include_usage: true },
      messages: [{ role: 'user', content: ask(name, 'Say hello with usage details.') }] }, { signal: timeout() });
    let usage = null;
    for await (const ch of s) if (ch.usage) usage = ch.usage;
    return { usage };
  },
  'openai-models': async () => {
    const ids = [];
    for await (const m of client.models.list()) ids.push(m);
    return { models: ids };
  },
  'openai-tool-stream': async (name) => {
    const s = client.chat.completions.stream({ model, messages: [{ role: 'user', content: ask(name, 'Weather in Paris?') }],
      tools: [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }],
      tool_choice: 'auto', parallel_tool_calls: false }, { signal: timeout() });
    const done = await s.finalChatCompletion();
    const c = done.choices[0];
    return { finish: c.finish_reason, toolCalls: c.message.tool_calls ?? [], content: c.message.content };
  },
  'openai-runtools': async (name) => {
    const runner = client.chat.completions.runTools({ model, messages: [{ role: 'user', content: ask(name, 'Weather in Paris?') }],
      tools: [zodFunction({ name: 'get_weather', parameters: weatherSchema, function: weather })] }, { signal: timeout() });
    const content = await runner.finalContent();
    return { content, messages: runner.messages.map((m) => m.role) };
  },
  'openai-parse': async (name) => {
    const r = await client.chat.completions.parse({ model, messages: [{ role: 'user', content: ask(name, 'Weather in Paris as JSON.') }],
      response_format: zodResponseFormat(citySchema, 'city_weather'), seed: 7, top_p: 0.9, user: 'sdk-test' }, { signal: timeout() });
    return { parsed: r.choices[0].message.parsed, usage: r.usage };
  },
  'openai-image': async (name) => {
    const r = await client.chat.completions.create({ model, messages: [{ role: 'user', content: [
      { type: 'text', text: ask(name, 'What is in this image?') }, { type: 'image_url', image_url: { url: pixel, detail: 'low' } }] }] }, { signal: timeout() });
    return { content: r.choices[0].message.content };
  },
  'openai-reasoning-stream': async (name) => {
    const s = await client.chat.completions.create({ model, stream: true, reasoning_effort: 'low',
      messages: [{ role: 'user', content: ask(name, `${'Think step by step'}: weather?`) }] }, { signal: timeout() });
    let content = '', reasoning = '';
    for await (const ch of s) for (const c of ch.choices) { content += c.delta.content ?? ''; reasoning += c.delta.reasoning_content ?? ''; }
    return { content, reasoning };
  },

  // The Vercel AI SDK: @ai-sdk/openai's chat model.
  'ai-chat-stream': async (name) =>
    aiResult(streamText({ model: openai.chat(model), prompt: ask(name, 'Say hello.'), maxRetries: 0, abortSignal: timeout() })),
  'ai-chat-generate': async (name) =>
    aiResult(await generateText({ model: openai.chat(model), prompt: ask(name, 'Say hello.'), maxRetries: 0, abortSignal: timeout() })),
  'ai-usage-details': async (name) =>
    aiResult(await generateText({ model: openai.chat(model), prompt: ask(name, 'Say hello with usage details.'), maxRetries: 0, abortSignal: timeout() })),
  'ai-chat-tools-stream': async (name) =>
    aiResult(streamText({ model: openai.chat(model), prompt: ask(name, 'Weather in Paris?'), tools: aiTools,
      stopWhen: isStepCount(3), maxRetries: 0, abortSignal: timeout() })),
  'ai-chat-tools-generate': async (name) =>
    aiResult(await generateText({ model: openai.chat(model), prompt: ask(name, 'Weather in Paris?'), tools: aiTools,
      stopWhen: isStepCount(3), maxRetries: 0, abortSignal: timeout() })),
  'ai-chat-object': async (name) => {
    const r = await generateText({ model: openai.chat(model), prompt: ask(name, 'Weather in Paris as JSON.'),
      output: Output.object({ schema: citySchema }), maxRetries: 0, abortSignal: timeout() });
    return { output: r.output };
  },
  'ai-chat-image': async (name) =>
    aiResult(await generateText({ model: openai.chat(model), maxRetries: 0, abortSignal: timeout(), messages: [{ role: 'user', content: [
      { type: 'text', text: ask(name, 'What is in this image?') }, { type: 'image', image: pixel }] }] })),

  // @ai-sdk/openai's default model: the Responses API.
  'ai-responses-generate': async (name) =>
    aiResult(await generateText({ model: openai(model), prompt: ask(name, 'Say hello.'), maxRetries: 0, abortSignal: timeout() })),
  'ai-responses-stream': async (name) =>
    aiResult(streamText({ model: openai(model), prompt: ask(name, 'Say hello.'), maxRetries: 0, abortSignal: timeout() })),

  'ai-responses-tools-generate': async (name) =>
    aiResult(await generateText({ model: openai(model), prompt: ask(name, 'Weather in Paris?'), tools: aiTools,
      stopWhen: isStepCount(3), maxRetries: 0, abortSignal: timeout() })),
  'ai-responses-tools-stream': async (name) =>
    aiResult(streamText({ model: openai(model), prompt: ask(name, 'Weather in Paris?'), tools: aiTools,
      stopWhen: isStepCount(3), maxRetries: 0, abortSignal: timeout() })),

  // @ai-sdk/openai-compatible.
  'compat-stream': async (name) =>
    aiResult(streamText({ model: compat(model), prompt: ask(name, 'Say hello.'), maxRetries: 0, abortSignal: timeout() })),
  'compat-tools-stream': async (name) =>
    aiResult(streamText({ model: compat(model), prompt: ask(name, 'Weather in Paris?'), tools: aiTools,
      stopWhen: isStepCount(3), maxRetries: 0, abortSignal: timeout() })),
  'compat-reasoning-stream': async (name) =>
    aiResult(streamText({ model: compat(model), prompt: ask(name, `${'Think step by step'}: weather?`), maxRetries: 0, abortSignal: timeout() })),
  'compat-object': async (name) => {
    const r = await generateText({ model: compat(model), prompt: ask(name, 'Weather in Paris as JSON.'),
      output: Output.object({ schema: citySchema }), maxRetries: 0, abortSignal: timeout() });
    return { output: r.output };
  },
  'compat-image': async (name) =>
    aiResult(await generateText({ model: compat(model), maxRetries: 0, abortSignal: timeout(), messages: [{ role: 'user', content: [
      { type: 'text', text: ask(name, 'What is in this image?') }, { type: 'image', image: pixel }] }] })),
};

const out = {};
for (const [name, run] of Object.entries(cases)) {
  if (only && name !== only) continue;
  try {
    out[name] = await run(name);
  } catch (e) {
    out[name] = { error: `${e?.name ?? 'Error'}: ${e?.message ?? e}`, status: e?.status ?? e?.statusCode ?? null };
  }
}
process.stdout.write(JSON.stringify(out) + '\n');
