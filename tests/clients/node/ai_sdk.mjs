// The Vercel AI SDK as its docs use it (generateText, streamText, tools with `execute`, a tool
// loop bounded by `stopWhen: isStepCount(n)`, a chat carried on with `responseMessages`),
// against the gateway. Cases come as JSON on stdin, results go as JSON to stdout: the pytest
// side (tests/clients/test_ai_sdk.py) says what each case asks and judges what came back, so
// node starts once for all of them.
import { generateText, streamText, tool, isStepCount } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';
import { createAnthropic } from '@ai-sdk/anthropic';
import { z } from 'zod';

// Warnings are collected per call (onWarning), not logged to the console.
globalThis.AI_SDK_LOG_WARNINGS = false;

async function readStdin() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return JSON.parse(Buffer.concat(chunks).toString('utf8'));
}

// Every request of a case carries `x-request-id: <case>-<n>`, so the gateway's usage records of
// that case can be told apart; its body and the answer's status are kept.
function recordingFetch(name, requests) {
  return async (url, init) => {
    const id = `${name}-${requests.length}`;
    const headers = new Headers(init?.headers);
    headers.set('x-request-id', id);
    const body = typeof init?.body === 'string' ? JSON.parse(init.body) : null;
    const entry = { id, url: String(url), body, status: null };
    requests.push(entry);
    const response = await fetch(url, { ...init, headers });
    entry.status = response.status;
    return response;
  };
}

function model(api, alias, baseURL, fetch) {
  const options = { baseURL: `${baseURL}/v1`, apiKey: 'tgw-unused', fetch };
  if (api === 'responses') return createOpenAI(options)(alias);
  if (api === 'chat') return createOpenAI(options).chat(alias);
  if (api === 'anthropic') return createAnthropic(options)(alias);
  throw new Error(`unknown api ${api}`);
}

function errorOf(error) {
  if (error == null) return null;
  return {
    name: error.name ?? null,
    message: String(error.message ?? error),
    statusCode: error.statusCode ?? null,
    responseBody: error.responseBody ?? null,
  };
}

async function turn(spec, baseModel, messages, executed, warnings, streamErrors) {
  const tools = {
    [spec.toolName]: tool({
      description: 'The weather in a city',
      inputSchema: z.object({ city: z.string() }),
      execute: async (input) => {
        executed.push(input);
        return spec.toolOutput;
      },
    }),
  };
  const call = {
    model: baseModel,
    messages,
    stopWhen: isStepCount(spec.maxSteps ?? 4),
    // Set, so the Anthropic provider does not warn that it guessed an unknown model's cap.
    maxOutputTokens: 1000,
    onWarning: ({ warnings: some }) => warnings.push(...some),
    ...(spec.toolOutput != null ? { tools } : {}),
    ...(spec.providerOptions ? { providerOptions: spec.providerOptions } : {}),
  };
  if (spec.mode === 'generate') {
    const result = await generateText(call);
    return { steps: result.steps, text: result.text, responseMessages: result.responseMessages };
  }
  const result = streamText({ ...call, onError: ({ error }) => streamErrors.push(errorOf(error)) });
  // The stream read to its end, as an app rendering it would.
  for await (const _ of result.textStream) {
    // nothing: the steps hold what came
  }
  return {
    steps: await result.steps,
    text: await result.text,
    responseMessages: await result.responseMessages,
  };
}

async function runCase(spec, baseURL) {
  const requests = [];
  const executed = [];
  const warnings = [];
  const turns = [];
  const streamErrors = [];
  const out = { name: spec.name, requests, executed, warnings, streamErrors, turns, error: null };
  const baseModel = model(spec.api, spec.alias, baseURL, recordingFetch(spec.name, requests));
  const messages = [];
  try {
    for (const prompt of spec.prompts) {
      // The next turn: everything so far, the answer's own messages included, then the user.
      messages.push({ role: 'user', content: prompt });
      const done = await turn(spec, baseModel, [...messages], executed, warnings, streamErrors);
      messages.push(...done.responseMessages);
      turns.push({
        text: done.text,
        steps: done.steps.map((step) => ({
          finishReason: step.finishReason,
          responseId: step.response?.id ?? null,
          warnings: step.warnings ?? [],
          content: step.content,
        })),
        responseMessages: done.responseMessages,
      });
    }
  } catch (error) {
    out.error = errorOf(error);
  }
  return out;
}

const input = await readStdin();
const results = {};
for (const spec of input.cases) {
  results[spec.name] = await runCase(spec, input.baseURL);
}
process.stdout.write(JSON.stringify(results));
