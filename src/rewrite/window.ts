/**
 * The sliding window at one Softmax site (policy/window.ts): its bias is added to the logits right after the
 * factor, unscaled, before any prior and every mask of the model, so a hidden key stays hidden whatever the factor.
 */
import { AttentionSite } from '../detect/find-attention';
import { PART } from '../identity';
import { Builder } from './builder';
import { ScaleContext } from './insert-scale';

export function insertWindow(ctx: ScaleContext, b: Builder, site: AttentionSite): void {
  const consumer = site.consumer;
  const current = consumer.node.input[consumer.index];
  const bias = ctx.sources.windowBias(site, site.logitsType, current);
  b.editor.setInput(consumer.node, consumer.index, b.op('Add', [current, bias], {}, PART.window));
}
